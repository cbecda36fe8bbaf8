"""Tests of attention_site (the site's tooling) and the pages: figures, diagrams, runs, the explorer, the pages' rules."""
