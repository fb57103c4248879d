"""Build a tiny Llama-architecture model with random weights and a byte-level
BPE tokenizer trained on local text, saved for a vLLM engine to serve.

Runs inside the vLLM venv (it needs torch, transformers and tokenizers):
    python tiny_model.py OUT_DIR
"""

import json
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

CORPUS = [
    "You are a helpful assistant for the acme support desk. Answer briefly and cite the manual.",
    "Summarize the following document in three sentences for an executive reader.",
    "Translate the text into French, keeping product names unchanged.",
    "The quick brown fox jumps over the lazy dog while the cache warms up before peak traffic.",
    "Prefix caching reuses the key and value tensors of a shared prompt prefix across requests.",
] + [
    f"ticket {i}: the user asks about invoice {i * 7} and order {i * 13} status" for i in range(400)
]


def main(out: str) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<s>", "</s>", "<pad>"]
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 3, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(out_dir, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"dir": str(out_dir), "parameters": n, "vocab": len(fast)}))


if __name__ == "__main__":
    main(sys.argv[1])
