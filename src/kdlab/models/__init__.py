"""Models: ``toy`` (kdlab's tiny Llama / Qwen2 presets, checkpoint save / load / verify),
``tokenizer`` (the character tokenizer), ``codec`` (char or Hugging Face tokenizer as one
interface), ``hf`` (loading real checkpoints), ``smol`` (the SmolLM2 import) and ``store`` (the
model store's content addressing and the shipped checkpoints). Imports ``core`` and ``tasks`` only."""
