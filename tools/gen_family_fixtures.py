"""Golden fixtures for the model families of issue 36 (Qwen3, OLMo 2, Phi-3/Phi-4-mini, Gemma 3 text,
Gemma 2, Qwen3-MoE), made by the real libraries (transformers 5.17, PEFT 0.21).

For each family it builds a tiny random checkpoint from the family's real config fields (small widths;
the published configs' shapes of rope, norms, windows and fused projections are kept), and writes under
OUT/<family>/:
  config.json, model.safetensors   save_pretrained (safetensors, float32)
  tokenizer files                  the byte-level BPE tokenizer of fixtures/peft-tiny (vocab 512)
  chat_template.jinja              a template in the family's style (Qwen3: <think> handling)
  adapters/<name>/                 three PEFT LoRA adapters (different targets and ranks; Phi-3 on the
                                   fused qkv_proj / gate_up_proj modules; Qwen3-MoE on expert parameters)
and under OUT/:
  golden.json          per family: the prompts' ids, greedy 16-token continuations (base and every adapter),
                       the chat renderings (apply_chat_template, text and ids) with greedy outputs, the
                       mixed-batch adapter names, the checkpoint's tensor names, notes on what failed
  golden.safetensors   logits of both prompts at every 5th and the last position (golden.json's
                       logit_positions; base and every adapter, f32), and the last position's logits of a
                       mixed-adapter batch (PEFT's adapter_names)
  cuda-bf16.json       greedy tokens per family/adapter/prompt from the saved files loaded in bfloat16 on
                       CUDA (or the reason it was skipped)

Goldens are computed on CPU in float32 with eager attention, seeded, whatever devices exist; the second
prompts are longer than every sliding window; the second is past Phi-3's original_max_position_embeddings.

Run (torch, transformers 5.17, peft 0.21, safetensors; no network needed):
    python3 tools/gen_family_fixtures.py --out fixtures/hf-families [--tokenizer fixtures/peft-tiny/tokenizer]
"""
import argparse
import copy
import json
import os
import shutil
import traceback

import torch
from safetensors.torch import save_file

AP = argparse.ArgumentParser(description=__doc__.split("\n")[0])
AP.add_argument("--out", required=True, help="output directory")
AP.add_argument("--tokenizer", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "peft-tiny", "tokenizer"),
                help="directory of the tokenizer to reuse (tokenizer.json, tokenizer_config.json)")
AP.add_argument("--families", default="qwen3,olmo2,phi3,gemma3_text,gemma2,qwen3_moe", help="comma-separated subset")
AP.add_argument("--no-cuda", action="store_true", help="skip the bf16 CUDA greedy run")
ARGS = AP.parse_args()

import transformers  # noqa: E402
import peft  # noqa: E402
import safetensors  # noqa: E402
import tokenizers  # noqa: E402

VERSIONS = {m.__name__: m.__version__ for m in (torch, transformers, peft, tokenizers, safetensors)}
print(VERSIONS, flush=True)
OUT = ARGS.out
os.makedirs(OUT, exist_ok=True)
CPU = torch.device("cpu")
GEN = 16

# Both prompts are longer than the sliding windows (8); prompt 0 plus its 16 generated tokens stays within
# Phi-3's original 64 positions (short rope factors throughout), prompt 1 is past them (long factors). No
# greedy run crosses 64 mid-generation: there transformers' Phi-3 generate drops its cache and continues
# from the new token alone (Phi3ForCausalLM.prepare_inputs_for_generation), which is no reference.
PROMPTS = [
    "Return a new list containing all items from the iterable",
    "The staged program folds static weights ahead of time; the serving engine batches many tenants, each "
    "with its own adapter, through one step.",
]
PHI3_ORIGINAL_MAX = 64
CHATS = [
    [{"role": "user", "content": "Tell me about staged programs."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name one adapter."},
     {"role": "assistant", "content": "Seven."}, {"role": "user", "content": "Again"}],
]

# Chat templates in each family's style, kept to what the served tokenizer can encode (the byte-level
# BPE has no chat special tokens, so markers encode as ordinary text).
QWEN3_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
GEMMA_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set first = messages[0]['content'] + '\\n\\n' %}{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set first = '' %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{- '<start_of_turn>' + role + '\\n' + (first if loop.first else '') + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)
PHI3_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>' }}{%- else %}{{- eos_token }}{%- endif %}"
)
OLMO2_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}"
)


def all_linear(extra=()):
    return ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", *extra]


# ------------------------------------------------------------------ family definitions
# Each: config class name, model class name, config kwargs (the published fields, small widths),
# chat template (and extra template variables per chat), adapters {name: LoraConfig kwargs}.
def families(vocab, bos, eos):
    common = dict(vocab_size=vocab, bos_token_id=bos, eos_token_id=eos, pad_token_id=None, attn_implementation="eager")
    return {
        # Qwen3-8B's fields: head_dim 128 with hidden 4096 / 32 heads; here head_dim 32 with hidden 64 / 4 heads
        # (head_dim independent of hidden / heads); tied embeddings as Qwen3-0.6B..4B.
        "qwen3": dict(
            config="Qwen3Config", model="Qwen3ForCausalLM",
            kwargs=dict(common, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=32, hidden_act="silu", max_position_embeddings=512,
                        rms_norm_eps=1e-6, rope_theta=1000000.0, rope_scaling=None, tie_word_embeddings=True,
                        attention_bias=False, use_sliding_window=False, sliding_window=None, max_window_layers=2),
            template=QWEN3_TEMPLATE, chat_vars=[{}, {"enable_thinking": False}],
            adapters={
                "qv-r8": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
                "all-r4-rslora": dict(r=4, lora_alpha=8, use_rslora=True, target_modules=all_linear()),
                "mlp-ko-r2": dict(r=2, lora_alpha=32, target_modules=["k_proj", "o_proj", "down_proj"]),
            }),
        # OLMo-2-1124-7B's fields (MHA, rms_norm_eps 1e-6, rope_theta 500000, untied).
        "olmo2": dict(
            config="Olmo2Config", model="Olmo2ForCausalLM",
            kwargs=dict(common, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=4, hidden_act="silu", max_position_embeddings=512, rms_norm_eps=1e-6,
                        rope_theta=500000.0, rope_scaling=None, tie_word_embeddings=False, attention_bias=False),
            template=OLMO2_TEMPLATE, chat_vars=[{}, {}],
            adapters={
                "qk-r8": dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj"]),
                "all-r4": dict(r=4, lora_alpha=4, target_modules=all_linear()),
                "vo-mlp-r2-rslora": dict(r=2, lora_alpha=8, use_rslora=True, target_modules=["v_proj", "o_proj", "up_proj"]),
            }),
        # Phi-4-mini's fields: partial_rotary_factor 0.75, longrope with short/long factors (rotary_ndims/2 each),
        # original_max_position_embeddings < max_position_embeddings, tied embeddings, GQA. Here rotary
        # dims 12 of head_dim 16 (6 factors), original 64 of 512 positions (factor 8: attention scaling
        # sqrt(1 + ln 8 / ln 64)); prompt 1 is past 64 positions, so it takes the long factors.
        "phi3": dict(
            config="Phi3Config", model="Phi3ForCausalLM",
            kwargs=dict(common, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, hidden_act="silu", max_position_embeddings=512,
                        original_max_position_embeddings=PHI3_ORIGINAL_MAX, rms_norm_eps=1e-5, rope_theta=10000.0,
                        partial_rotary_factor=0.75,
                        rope_scaling={"type": "longrope",
                                      "short_factor": [1.0, 1.05, 1.2, 1.6, 2.5, 4.0],
                                      "long_factor": [1.0, 1.3, 2.1, 3.9, 7.5, 15.0]},
                        tie_word_embeddings=True, sliding_window=None),
            template=PHI3_TEMPLATE, chat_vars=[{}, {}],
            adapters={
                "qkv-r8": dict(r=8, lora_alpha=16, target_modules=["qkv_proj"]),
                "fused-all-r4": dict(r=4, lora_alpha=8, target_modules=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
                "gate_up-r2-rslora": dict(r=2, lora_alpha=4, use_rslora=True, target_modules=["gate_up_proj"]),
            }),
        # Gemma-3-4b's text fields: head_dim 256 independent of hidden / heads, query_pre_attn_scalar,
        # rope_theta 1e6 (global, linear scaling factor 8) and rope_local_base_freq 1e4 (sliding layers),
        # sliding_window_pattern 6 (here 2: layer 0 sliding, layer 1 global), (1 + w) norms,
        # GELU-tanh, tied embeddings scaled by sqrt(hidden). Window 8 (prompt 1 is longer).
        "gemma3_text": dict(
            config="Gemma3TextConfig", model="Gemma3ForCausalLM",
            kwargs=dict(common, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=32, hidden_activation="gelu_pytorch_tanh",
                        max_position_embeddings=1024, rms_norm_eps=1e-6, query_pre_attn_scalar=24,
                        rope_theta=1000000.0, rope_local_base_freq=10000.0,
                        rope_scaling={"rope_type": "linear", "factor": 8.0}, sliding_window=8,
                        sliding_window_pattern=2, final_logit_softcapping=None, attn_logit_softcapping=None,
                        tie_word_embeddings=True),
            template=GEMMA_TEMPLATE, chat_vars=[{}, {}],
            adapters={
                "qv-r8": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
                "all-r4": dict(r=4, lora_alpha=8, target_modules=all_linear()),
                "mlp-r2-rslora": dict(r=2, lora_alpha=4, use_rslora=True, target_modules=["gate_proj", "up_proj", "down_proj"]),
            }),
        # Gemma 2: attention and final logit soft-capping (small caps here so they bend tiny random logits),
        # alternating sliding/global layers, query_pre_attn_scalar, no q/k norms.
        "gemma2": dict(
            config="Gemma2Config", model="Gemma2ForCausalLM",
            kwargs=dict(common, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, hidden_activation="gelu_pytorch_tanh",
                        max_position_embeddings=1024, rms_norm_eps=1e-6, query_pre_attn_scalar=16,
                        rope_theta=10000.0, sliding_window=8, final_logit_softcapping=3.0,
                        attn_logit_softcapping=2.0, tie_word_embeddings=True),
            template=GEMMA_TEMPLATE, chat_vars=[{}, {}],
            adapters={
                "qv-r8": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
                "all-r4": dict(r=4, lora_alpha=8, target_modules=all_linear()),
                "o-down-r2": dict(r=2, lora_alpha=16, target_modules=["o_proj", "down_proj"]),
            }),
        # Qwen3-30B-A3B's fields: routed experts (moe_intermediate_size), norm_topk_prob, head_dim, q/k norms;
        # mlp_only_layers [1] makes layer 1 dense (intermediate_size) after MoE layer 0.
        "qwen3_moe": dict(
            config="Qwen3MoeConfig", model="Qwen3MoeForCausalLM",
            kwargs=dict(common, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=32, hidden_act="silu",
                        max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_scaling=None,
                        tie_word_embeddings=False, attention_bias=False, use_sliding_window=False, sliding_window=None,
                        decoder_sparse_step=1, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                        mlp_only_layers=[1]),
            template=QWEN3_TEMPLATE, chat_vars=[{}, {"enable_thinking": False}],
            # PEFT allows one set of target parameters across adapters, and its ParamWrapper (expert LoRA)
            # refuses mixed batches: the mixed batch falls back to the attention-only adapters.
            adapters={
                "attn-r8": dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
                "qo-r4-rslora": dict(r=4, lora_alpha=8, use_rslora=True, target_modules=["q_proj", "o_proj"]),
                "experts-r2": dict(r=2, lora_alpha=4, target_modules=["v_proj", "gate_proj", "up_proj", "down_proj"],
                                   target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]),
            }),
    }


# ------------------------------------------------------------------ helpers
def note(meta, msg):
    print(msg, flush=True)
    meta.setdefault("notes", []).append(msg)


def ids_of(out):
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(x) for x in out]


def greedy(model, ids, n=GEN, device=CPU):
    with torch.no_grad():
        x = torch.tensor([ids], device=device)
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def positions(n):
    """The prompt positions whose logits are stored (every 5th and the last), to keep the fixtures small."""
    return sorted(set(range(0, n, 5)) | {n - 1})


def logits_at(model, ids):
    with torch.no_grad():
        full = model(input_ids=torch.tensor([ids])).logits[0].float()
    return full[positions(len(ids))].contiguous()


def perturb(model):
    """Make the random weights non-trivial: scale matrices by 2, and spread norm weights around their init
    (Gemma's zeros included, so (1 + w) is exercised)."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
            else:
                p.mul_(2.0)


def save_tokenizer(tok, dirpath, template):
    tok.chat_template = template
    tok.save_pretrained(dirpath)
    if not os.path.exists(os.path.join(dirpath, "chat_template.jinja")):
        with open(os.path.join(dirpath, "chat_template.jinja"), "w") as f:
            f.write(template)


def do_family(fam, spec, tok, tensors, meta):
    from peft import LoraConfig, get_peft_model
    cfg_cls = getattr(transformers, spec["config"])
    model_cls = getattr(transformers, spec["model"])
    torch.manual_seed(36)
    cfg = cfg_cls(**spec["kwargs"])
    model = model_cls(cfg).to(CPU).float().eval()
    perturb(model)
    root = os.path.join(OUT, fam)
    model.save_pretrained(root)
    gc = os.path.join(root, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)
    save_tokenizer(copy.deepcopy(tok), root, spec["template"])
    ftok = transformers.AutoTokenizer.from_pretrained(root)  # goldens from the saved files, as users load them
    from safetensors import safe_open
    with safe_open(os.path.join(root, "model.safetensors"), "pt") as f:
        keys = sorted(f.keys())
    m = {"config_class": spec["config"], "model_class": spec["model"], "checkpoint_keys": keys,
         "layer_types": list(getattr(cfg, "layer_types", None) or []), "prompts": {}, "adapters": {}}
    meta[fam] = m
    prompt_ids = [ids_of(ftok(p)) for p in PROMPTS]
    m["prompt_ids"] = prompt_ids
    m["logit_positions"] = [positions(len(ids)) for ids in prompt_ids]
    if not (len(prompt_ids[0]) + GEN <= PHI3_ORIGINAL_MAX < len(prompt_ids[1])):
        note(meta, f"{fam}: prompt lengths {[len(x) for x in prompt_ids]} do not straddle Phi-3's original {PHI3_ORIGINAL_MAX} positions")
    with torch.no_grad():
        for i, ids in enumerate(prompt_ids):
            tensors[f"{fam}.base.prompt{i}.logits"] = logits_at(model, ids)
            m["prompts"][f"prompt{i}"] = {"greedy_new_ids": greedy(model, ids)}

    # chats on the base model (apply_chat_template from the saved files)
    m["chat"] = []
    for msgs, extra in zip(CHATS, spec["chat_vars"]):
        ids = ids_of(ftok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, **extra))
        text = ftok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, **extra)
        m["chat"].append({"messages": msgs, "variables": extra, "text": text, "input_ids": ids,
                          "greedy_new_ids": greedy(model, ids)})
        if fam == "phi3" and len(ids) <= PHI3_ORIGINAL_MAX < len(ids) + GEN:
            note(meta, f"phi3: chat of {len(ids)} tokens crosses the original {PHI3_ORIGINAL_MAX} positions while generating")

    # adapters
    pm = None
    names = []
    for name, kw in spec["adapters"].items():
        try:
            lc = LoraConfig(lora_dropout=0.0, init_lora_weights=False, bias="none", **kw)
            if pm is None:
                pm = get_peft_model(model, lc, adapter_name=name)
            else:
                pm.add_adapter(name, lc)
            names.append(name)
        except Exception as e:  # recorded: the tests read which adapters exist
            note(meta, f"{fam}: adapter {name} failed: {e!r}")
            traceback.print_exc()
    if pm is None:
        return
    pm.eval()
    pm.save_pretrained(os.path.join(root, "adapters"), selected_adapters=names)
    for name in names:
        pm.set_adapter(name)
        a = {"config": spec["adapters"][name], "prompts": {}}
        with torch.no_grad():
            for i, ids in enumerate(prompt_ids):
                tensors[f"{fam}.{name}.prompt{i}.logits"] = logits_at(pm, ids)
                a["prompts"][f"prompt{i}"] = {"greedy_new_ids": greedy(pm, ids)}
        m["adapters"][name] = a
    # mixed batch: one row per adapter and a base row on prompt 0; last position's logits. Adapters PEFT
    # cannot mix (expert parameters) are left out, and the note says so.
    mixable = [n for n in names if not spec["adapters"][n].get("target_parameters")]
    for an in (names + ["__base__"], mixable + ["__base__"]):
        try:
            ids = prompt_ids[0]
            with torch.no_grad():
                logits = pm(input_ids=torch.tensor([ids] * len(an)), adapter_names=an).logits[:, -1].float()
            tensors[f"{fam}.mixed.last_logits"] = logits.contiguous()
            m["mixed"] = {"adapter_names": an, "prompt": 0}
            break
        except Exception as e:
            note(meta, f"{fam}: mixed batch of {an} failed: {e!r}")


def cuda_bf16(fams, meta):
    """Greedy tokens from the saved files in bfloat16 on CUDA (base and every saved adapter)."""
    out = {"versions": VERSIONS}
    if ARGS.no_cuda or not torch.cuda.is_available():
        out["skipped"] = "no CUDA device" if not ARGS.no_cuda else "--no-cuda"
        return out
    from peft import PeftModel
    dev = torch.device("cuda")
    out["device"] = torch.cuda.get_device_name(0)
    for fam in fams:
        if fam not in meta:
            continue
        try:
            root = os.path.join(OUT, fam)
            ids_list = meta[fam]["prompt_ids"]
            base = transformers.AutoModelForCausalLM.from_pretrained(root, dtype=torch.bfloat16, attn_implementation="eager").to(dev).eval()
            r = {"base": {f"prompt{i}": greedy(base, ids, device=dev) for i, ids in enumerate(ids_list)}}
            for name in meta[fam]["adapters"]:
                pm = PeftModel.from_pretrained(base, os.path.join(root, "adapters", name), adapter_name=name).to(dev).eval()
                r[name] = {f"prompt{i}": greedy(pm, ids, device=dev) for i, ids in enumerate(ids_list)}
                base = pm.unload()
            out[fam] = r
        except Exception as e:
            out.setdefault("errors", {})[fam] = repr(e)
            traceback.print_exc()
    return out


def main():
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(ARGS.tokenizer)
    vocab = len(tok)
    bos, eos = tok.bos_token_id, tok.eos_token_id
    specs = families(vocab, bos, eos)
    wanted = [f.strip() for f in ARGS.families.split(",") if f.strip()]
    meta = {"versions": VERSIONS, "prompts": PROMPTS, "gen_tokens": GEN, "vocab": vocab, "families": wanted}
    tensors = {}
    for fam in wanted:
        try:
            do_family(fam, specs[fam], tok, tensors, meta)
        except Exception as e:
            note(meta, f"{fam} failed: {e!r}")
            traceback.print_exc()
            shutil.rmtree(os.path.join(OUT, fam), ignore_errors=True)
            meta.pop(fam, None)
    save_file(tensors, os.path.join(OUT, "golden.safetensors"))
    with open(os.path.join(OUT, "golden.json"), "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
    bf16 = cuda_bf16(wanted, meta)
    with open(os.path.join(OUT, "cuda-bf16.json"), "w") as f:
        json.dump(bf16, f, indent=1)
    total = sum(os.path.getsize(os.path.join(d, x)) for d, _, xs in os.walk(OUT) for x in xs)
    print("done", {f: len(meta[f]["adapters"]) for f in wanted if f in meta}, f"{total / 1e6:.2f} MB",
          "notes:", meta.get("notes", []), flush=True)


main()
