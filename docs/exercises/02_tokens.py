# %% [markdown]
# # Exercise 2: tokens to vectors
#
# Chapter 2: [Tokens to vectors](../tokens.md). On the site, every output below was computed by
# the site's build (the footer says which); the downloads (links above) start without outputs:
# run them and change them.
#
# Token ids become vectors by two table look-ups, one for the token and one for its position:
#
# $$x^{(t)} = E_\text{tok}[\mathrm{id}_t] + E_\text{pos}[t]$$

# %%
import torch

from attention.derivation.text import (
    GPT2_VOCAB_SIZE,
    TokenAndPositionEmbedding,
    gpt2_encoding,
    sample_text,
    sliding_windows,
)

tokenizer = gpt2_encoding()
token_ids = tokenizer.encode(sample_text())  # n ids
len(token_ids)

# %% [markdown]
# ## Exercise 2.1: how many windows?
#
# Only full windows are kept. Work out how many (input, target) windows of `max_length`
# tokens a stream of $n$ ids gives for a stride $s$ (each window needs `max_length + 1` ids:
# its input and, one further, its target), and check your formula against
# `sliding_windows` for a few strides.


# %%
# Solution
def num_windows(n, max_length, stride):
    return (n - max_length - 1) // stride + 1


n, max_length = len(token_ids), 8
for stride in (1, 3, 8, 20):
    # inputs: (num_windows, max_length)
    inputs, _ = sliding_windows(token_ids, max_length, stride)
    expected = num_windows(n, max_length, stride)
    assert inputs.shape == (expected, max_length)
    print(f"stride {stride:>2}: {inputs.shape[0]} windows")

# %% [markdown]
# ## Exercise 2.2: one token, two positions
#
# Encode a sentence in which a word occurs twice, such as "I saw the cat and the dog", embed
# it with `TokenAndPositionEmbedding`, and show that the two occurrences of the word share
# their token embedding but not their input embedding. (Careful: "the" at the very start of
# a text and " the" after a space are different tokens.)

# %%
# Solution
torch.manual_seed(123)
embedding = TokenAndPositionEmbedding(
    GPT2_VOCAB_SIZE,
    context_length=8,
    d_in=16,
)
sentence = "I saw the cat and the dog"
ids = torch.tensor([tokenizer.encode(sentence)])  # (1, 7)
the = tokenizer.encode(" the")[0]
# the two positions of " the"
first, second = (ids[0] == the).nonzero().flatten().tolist()

with torch.no_grad():
    tok_embeds = embedding.tok_emb(ids)[0]  # (7, 16)
    input_embeddings = embedding(ids)[0]  # (7, 16)
# same token, same row of E_tok; but different positions
assert torch.equal(tok_embeds[first], tok_embeds[second])
x = input_embeddings  # (7, 16)
assert not torch.allclose(x[first], x[second])
print(f"' the' at positions {first} and {second}:")
print("same token embedding, different input embeddings")
