"""Floor 4, the lab: the chapters' experiments, small trainings run while the site builds.

- [`attention.lab.rnn`][attention.lab.rnn] and [`attention.lab.copy_task`][attention.lab.copy_task]:
  chapter 1, why attention: a GRU encoder-decoder with and without Bahdanau attention, and
  the experiment that compares them.
- [`attention.lab.training`][attention.lab.training]: chapter 8's model trained in the open:
  two heads that learn to read the previous and the first token.
- [`attention.lab.seq2seq`][attention.lab.seq2seq]: chapter 14, cross-attention: a
  transformer encoder-decoder on chapter 1's copy task.
- [`attention.lab.english`][attention.lab.english]: chapter 15's trained model: a
  character-level GPT that learns English from the Python documentation's topics in seconds
  (chapter 16 explores its heads).
- [`attention.lab.heads`][attention.lab.heads]: chapter 16, what trained heads do: every
  head's scores and weights, previous-token and induction scores, a small GPT trained to form
  them.
- [`attention.lab.recall`][attention.lab.recall]: where linear attention loses: chapter 16's
  induction task learned by softmax and by linear attention, their exact recall measured.
- [`attention.lab.threads`][attention.lab.threads]: every training here runs on few threads.
"""
