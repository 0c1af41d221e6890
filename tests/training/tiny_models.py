"""Tiny model configs whose parameter counts and activation sizes a person can count."""

from perfcast.workload import model_spec_from_config

# GPT-2 style: h = 64, 4 heads, 2 layers, MLP 4h, tied embedding, learned positions, dropout
GPT_H, GPT_HEADS, GPT_LAYERS, GPT_VOCAB, GPT_POSITIONS = 64, 4, 2, 1024, 512
GPT = model_spec_from_config({
    "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": GPT_H,
    "n_head": GPT_HEADS, "n_layer": GPT_LAYERS, "n_positions": GPT_POSITIONS,
    "vocab_size": GPT_VOCAB, "activation_function": "gelu_new", "resid_pdrop": 0.1,
    "embd_pdrop": 0.1, "attn_pdrop": 0.1}, name="tiny-gpt2")

# GPT-2 parameters counted by hand: per layer 4h^2 (qkv, o) + 8h^2 (MLP 4h) GEMM weights
# and two LayerNorms (2h each); token table V h, position table P h, final LayerNorm 2h.
# (Linear biases are not counted.)
GPT_PARAMS = (GPT_LAYERS * (12 * GPT_H**2 + 4 * GPT_H) + GPT_VOCAB * GPT_H
              + GPT_POSITIONS * GPT_H + 2 * GPT_H)

# Llama style, untied head: h = 64, 4 heads (2 KV heads of 16), SwiGLU of 128, 4 layers
LL_H, LL_HEADS, LL_KV, LL_INTER, LL_LAYERS, LL_VOCAB = 64, 4, 2, 128, 4, 1000
LLAMA = model_spec_from_config({
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": LL_H,
    "intermediate_size": LL_INTER, "num_hidden_layers": LL_LAYERS,
    "num_attention_heads": LL_HEADS, "num_key_value_heads": LL_KV, "vocab_size": LL_VOCAB,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16"}, name="tiny-llama")
_D = LL_H // LL_HEADS
# GEMM weights per layer: q (h x h), k and v (h x 2 x 16 each), o (h x h), gate+up
# (h x 2 x 128), down (128 x h); the LM head V x h
LL_LAYER_GEMM_PARAMS = (LL_H * LL_H + 2 * LL_H * LL_KV * _D + LL_H * LL_H
                        + 2 * LL_H * LL_INTER + LL_INTER * LL_H)
LL_HEAD_PARAMS = LL_VOCAB * LL_H

MIXTRAL = model_spec_from_config({
    "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 1024, "num_local_experts": 8,
    "num_experts_per_tok": 2, "torch_dtype": "bfloat16"}, name="tiny-mixtral")
