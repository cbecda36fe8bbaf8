"""The site's tooling, outside the library: what the pages and the build use, not its users.

`pip install literate-attention` installs none of this; the repository's nox sessions put it
on the path (it imports `attention`, never the other way round).

- [`attention_site.plot`][attention_site.plot]: every figure of the site.
- [`attention_site.diagrams`][attention_site.diagrams]: its box-and-arrow diagrams, drawn
  from the real shapes.
- [`attention_site.listing`][attention_site.listing]: source listings of the package's code.
- [`attention_site.runs`][attention_site.runs]: trained runs done once per process, and
  started early in another process by the site's build.
- [`attention_site.stored`][attention_site.stored]: trained runs kept on disk, keyed by the
  code, data and versions that produce them, shared by the build and the tests.
- [`attention_site.explorer`][attention_site.explorer]: the attention explorer's model, for
  the browser.
- [`attention_site.performance`][attention_site.performance]: the Performance page's tables
  and figures, from the benchmark's results files.
"""
