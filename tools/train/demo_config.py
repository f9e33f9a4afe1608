import json
cfg = {
  "architectures": ["DeepseekV41ForCausalLM"],
  "model_type": "deepseek_v41",
  "text_config": {
    "model_type": "deepseek_v41_text",
    "vocab_size": 4096, "hidden_size": 192, "num_hidden_layers": 8, "num_nextn_predict_layers": 2,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "hidden_act": "silu", "dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 1,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "qk_rope_head_dim": 16,
    "q_lora_rank": 96, "o_groups": 2, "o_lora_rank": 96, "sliding_window": 64,
    "attention_bias": False, "rope_theta": 10000, "compress_rope_theta": 160000,
    "rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 1024,
                     "beta_fast": 32, "beta_slow": 1},
    "compress_ratios": [0, 0, 2, 2, 1, 1, 1, 1, 0, 0],
    "kv_source_layer_ids": [2, 4], "index_source_layer_ids": [2, 4, 6],
    "candidate_source_layer_id": 4, "candidate_topk_blocks": 8, "candidate_block_size": 8,
    "index_n_heads": 4, "index_head_dim": 32, "index_topk": 32,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "moe_intermediate_size": 128, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
    "norm_topk_prob": True, "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-06,
    "engram_layer_ids": [1, 3], "engram_max_ngram_size": 3, "engram_n_heads": 4,
    "engram_head_dim": 32, "engram_vocab_size": 4000, "engram_num_embeddings": [],
    "engram_compressed_vocab_size": 3387, "engram_pad_token_id": 2,
    "dspark_block_size": 5, "dspark_noise_token_id": 17, "dspark_target_layer_ids": [5, 6, 7],
    "dspark_markov_rank": 32, "dspark_n_routed_experts": 4, "dspark_num_experts_per_tok": 2
  },
  "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                          "weight_block_size": [32, 32], "scale_fmt": "ue8m0", "expert_dtype": "fp4"}
}
import sys
sys.path.insert(0, "tools/reference")
from engram import EngramConstants
from checkpoint import parse_config
c = parse_config(cfg)
cfg["text_config"]["engram_num_embeddings"] = EngramConstants(c).rows
json.dump(cfg, open("models/demo/config.json", "w"), indent=2)
print(cfg["text_config"]["engram_num_embeddings"])
