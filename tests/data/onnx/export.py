"""Writes the ONNX regression models of switchyard's tests: small random-weight
Hugging Face transformers exported with torch.onnx.export (dynamo, opset 18), each
with inputs.safetensors and expected.safetensors (ONNX Runtime's outputs).

    python export.py OUT_DIR [--torchscript] [NAME...]

The default exporter is torch.export (dynamo, opset 18); --torchscript uses
the TorchScript exporter (opset 17) instead and writes NAME_ts.

Needs torch, transformers, onnx, onnxscript, onnxruntime, safetensors; the tests
only read what it wrote.
"""
import sys, os
import numpy as np, torch, transformers as T
import onnxruntime as ort
from safetensors.numpy import save_file
torch.manual_seed(0)
out_root = sys.argv[1]
common = dict(initializer_range=0.15)
def dec(cls_cfg, cls_model, **kw):
    return (cls_cfg, cls_model, kw, "decoder")
def enc(cls_cfg, cls_model, **kw):
    return (cls_cfg, cls_model, kw, "encoder")
specs = {
 "qwen2": dec(T.Qwen2Config, T.Qwen2ForCausalLM, num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, vocab_size=64, max_position_embeddings=64),
 "mistral": dec(T.MistralConfig, T.MistralForCausalLM, num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=1, intermediate_size=64, vocab_size=64, max_position_embeddings=64),
 "gpt_neox": dec(T.GPTNeoXConfig, T.GPTNeoXForCausalLM, num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=64, max_position_embeddings=64, rotary_pct=0.25),
 "phi": dec(T.PhiConfig, T.PhiForCausalLM, num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=64, max_position_embeddings=64, partial_rotary_factor=0.5),
 "opt": dec(T.OPTConfig, T.OPTForCausalLM, num_hidden_layers=2, hidden_size=32, num_attention_heads=4, ffn_dim=64, vocab_size=64, max_position_embeddings=64, word_embed_proj_dim=32),
 "gemma": dec(T.GemmaConfig, T.GemmaForCausalLM, num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=1, head_dim=8, intermediate_size=64, vocab_size=64, max_position_embeddings=64),
 "bloom": dec(T.BloomConfig, T.BloomForCausalLM, n_layer=2, hidden_size=32, n_head=4, vocab_size=64),
 "falcon": dec(T.FalconConfig, T.FalconForCausalLM, num_hidden_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=64, new_decoder_architecture=False, multi_query=True),
 "stablelm": dec(T.StableLmConfig, T.StableLmForCausalLM, num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=4, intermediate_size=64, vocab_size=64, max_position_embeddings=64),
 "codegen": dec(T.CodeGenConfig, T.CodeGenForCausalLM, n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=64, rotary_dim=4),
 "roberta": enc(T.RobertaConfig, T.RobertaModel, num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=64, max_position_embeddings=80),
 "distilbert": enc(T.DistilBertConfig, T.DistilBertModel, n_layers=2, dim=32, n_heads=4, hidden_dim=64, vocab_size=64, max_position_embeddings=64),
 "electra": enc(T.ElectraConfig, T.ElectraModel, num_hidden_layers=2, hidden_size=32, embedding_size=16, num_attention_heads=4, intermediate_size=64, vocab_size=64, max_position_embeddings=64),
 "albert": enc(T.AlbertConfig, T.AlbertModel, num_hidden_layers=2, hidden_size=32, embedding_size=16, num_attention_heads=4, intermediate_size=64, vocab_size=64, max_position_embeddings=64),
 "t5enc": enc(T.T5Config, T.T5EncoderModel, num_layers=2, d_model=32, d_kv=8, num_heads=4, d_ff=64, vocab_size=64),
 "bart_enc": enc(T.BartConfig, None, encoder_layers=2, d_model=32, encoder_attention_heads=4, encoder_ffn_dim=64, vocab_size=64, max_position_embeddings=64),
 "mpnet": enc(T.MPNetConfig, T.MPNetModel, num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=64, max_position_embeddings=80),
 "deberta": enc(T.DebertaV2Config, T.DebertaV2Model, num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=64, max_position_embeddings=64),
 "qwen3": dec(T.Qwen3Config, T.Qwen3ForCausalLM, num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64, vocab_size=64, max_position_embeddings=64),
 "phi3": dec(T.Phi3Config, T.Phi3ForCausalLM, num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, vocab_size=64, max_position_embeddings=64, pad_token_id=0),
 "cohere": dec(T.CohereConfig, T.CohereForCausalLM, num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=64, max_position_embeddings=64),
 "gptj": dec(T.GPTJConfig, T.GPTJForCausalLM, n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=64, rotary_dim=4),
 "bigcode": dec(T.GPTBigCodeConfig, T.GPTBigCodeForCausalLM, n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=64, multi_query=True),
 "mobilebert": enc(T.MobileBertConfig, T.MobileBertModel, num_hidden_layers=2, hidden_size=32, embedding_size=16, intra_bottleneck_size=16, true_hidden_size=16, num_attention_heads=4, intermediate_size=32, vocab_size=64, max_position_embeddings=64),
 "llama_scaled": dec(T.LlamaConfig, T.LlamaForCausalLM, num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, vocab_size=64, max_position_embeddings=64, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
 "nemotron": dec(T.NemotronConfig, T.NemotronForCausalLM, num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, vocab_size=64, max_position_embeddings=64, head_dim=8),
 "xlm_roberta": enc(T.XLMRobertaConfig, T.XLMRobertaModel, num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=64, max_position_embeddings=80),
 "clip_text": enc(T.CLIPTextConfig, T.CLIPTextModel, num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=64, max_position_embeddings=64),
}
for k in ["qwen2", "opt"]:
    specs[k + "_mask"] = specs[k]
torchscript = "--torchscript" in sys.argv
names = [a for a in sys.argv[2:] if a != "--torchscript"] or list(specs)
for name in names:
    cfg_cls, model_cls, kw, kind = specs[name]
    try:
        torch.manual_seed(1)
        cfg = cfg_cls(**kw, **common)
        cfg.use_cache = False
        cfg._attn_implementation = "eager"
        if name == "bart_enc":
            model = T.BartModel(cfg).get_encoder()
        else:
            model = model_cls(cfg)
        model.eval()
        rng = np.random.default_rng(7)
        ids = rng.integers(3, 64, size=(2, 16)).astype(np.int64)
        # Decoders named NAME_mask also take an attention mask with padding.
        if kind == "encoder" or name.endswith("_mask"):
            mask = np.ones((2, 16), dtype=np.int64); mask[1, -5:] = 0
            ids[1, -5:] = getattr(cfg, "pad_token_id", 0) or 0
            inputs = {"input_ids": ids, "attention_mask": mask}
            class W(torch.nn.Module):
                def __init__(s, m): super().__init__(); s.m = m
                def forward(s, input_ids, attention_mask):
                    o = s.m(input_ids=input_ids, attention_mask=attention_mask)
                    return o.logits if hasattr(o, "logits") else o.last_hidden_state
        else:
            inputs = {"input_ids": ids}
            class W(torch.nn.Module):
                def __init__(s, m): super().__init__(); s.m = m
                def forward(s, input_ids): return s.m(input_ids=input_ids, use_cache=False).logits
        w = W(model).eval()
        d = f"{out_root}/{name}" + ("_ts" if torchscript else ""); os.makedirs(d, exist_ok=True)
        args = tuple(torch.from_numpy(v) for v in inputs.values())
        if torchscript:
            torch.onnx.export(w, args, f"{d}/model.onnx", dynamo=False, opset_version=17, input_names=list(inputs), output_names=["out"])
        else:
            torch.onnx.export(w, args, f"{d}/model.onnx", dynamo=True, opset_version=18, optimize=True, external_data=False, input_names=list(inputs), output_names=["out"])
        s = ort.InferenceSession(f"{d}/model.onnx", providers=["CPUExecutionProvider"])
        res = s.run(None, inputs)
        with torch.no_grad():
            ref = w(*args).numpy()
        save_file(inputs, f"{d}/inputs.safetensors")
        save_file({"out": res[0]}, f"{d}/expected.safetensors")
        import onnx
        m = onnx.load(f"{d}/model.onnx")
        # Stack traces and shape annotations are most of the file; drop them.
        for node in m.graph.node:
            del node.metadata_props[:]
            node.doc_string = ""
        del m.metadata_props[:]
        del m.graph.value_info[:]
        m.doc_string = ""
        m.graph.doc_string = ""
        onnx.checker.check_model(m)
        onnx.save(m, f"{d}/model.onnx")
        ops = sorted(set(n.op_type for n in m.graph.node))
        print(f"OK {name}: ort-vs-torch {np.abs(res[0]-ref).max():.2e} ops {ops}", flush=True)
    except Exception as e:
        print(f"FAILED {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
