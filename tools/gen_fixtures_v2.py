"""Fixtures for vLLM/transformers drop-in compatibility (issue 18), made by the real libraries.

Writes, under OUTDIR:
  mistral-sw/            a tiny MistralForCausalLM with sliding_window 16 (transformers), a
                         SentencePiece-style byte-fallback BPE tokenizer (tokenizers: `<0x..>`
                         tokens, Prepend/Replace "▁" normalizer, ByteFallback/Fuse/Strip decoder)
                         and a ChatML chat template saved as chat_template.jinja
  mistral-sw/adapters/   two PEFT LoRA adapters (a, b) on that model
  bytelevel-chat/        the byte-level BPE tokenizer of fixtures/peft-tiny with two named chat
                         templates in tokenizer_config.json (the list form)
  golden.json            prompt ids (30-80 tokens), greedy tokens (base and adapters), chat ids
                         (= apply_chat_template), encodings of accented/CJK/emoji text
  golden.safetensors     full-prompt logits of every prompt (base and adapters)

Run on a machine with torch, transformers 5.17, peft 0.21, tokenizers, safetensors:
    python3 tools/gen_fixtures_v2.py OUTDIR [PEFT_TINY_TOKENIZER_DIR]
Float32 on CPU, seeded: reproducible.
"""
import json, os, shutil, sys, inspect, importlib
import torch
from safetensors.torch import save_file

OUT = sys.argv[1]
BYTELEVEL_SRC = sys.argv[2] if len(sys.argv) > 2 else "fixtures/peft-tiny/tokenizer"
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(18)

import transformers, peft, tokenizers, safetensors
VERSIONS = {m.__name__: m.__version__ for m in (torch, transformers, peft, tokenizers, safetensors)}
print(VERSIONS, flush=True)

CHATML = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
PLAIN = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- message['role'] | upper + ': ' + message['content'] + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- 'ASSISTANT:' }}{%- endif %}"
)
TOOLS = "{{- bos_token }}TOOLS{% for m in messages %} {{ m['content'] }}{% endfor %}"

UNICODE_TEXTS = [
    "Café au lait, naïve résumé: déjà vu à Zürich.",
    "中文分词测试：模型在边界上解码。",
    "Emoji 🤖🚀 and flags 🇫🇷 mixed with café ☕.",
    "Mixed: ü, 日本語, and 👩‍💻 together.",
]

CHATS = [
    [{"role": "user", "content": "Tell me about staged programs."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Café? 中文 🤖"}],
    [{"role": "developer", "content": "Answer in one word."}, {"role": "user", "content": "Hello"},
     {"role": "assistant", "content": "Hi"}, {"role": "user", "content": "Again"}],
]


def corpus():
    mods = ["json", "re", "os", "collections", "itertools", "functools", "pathlib", "string", "textwrap",
            "argparse", "logging", "typing", "dataclasses", "random", "statistics", "math", "heapq"]
    texts = []
    for name in mods:
        mod = importlib.import_module(name)
        for _, obj in inspect.getmembers(mod):
            doc = getattr(obj, "__doc__", None)
            if isinstance(doc, str) and len(doc) > 40 and doc.isascii():
                texts.append(" ".join(doc.split()))
    # a few accented words, so some non-ASCII letters are whole tokens and others fall back to bytes
    texts += ["café résumé déjà naïve é è à"] * 20
    return texts


def make_byte_fallback_tokenizer(vocab_size=512):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, decoders, trainers, processors
    specials = ["<unk>", "<s>", "</s>"]
    chat = ["<|im_start|>", "<|im_end|>"]
    n_base = len(specials) + 256 + len(chat)
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    # train with a split at "▁" so merges stay inside words, as SentencePiece's do
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - n_base, show_progress=False, special_tokens=[])
    trainer_tok.train_from_iterator(corpus(), trainer=trainer)
    trained = json.loads(trainer_tok.to_str())
    learned = sorted(trained["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {t: i for i, t in enumerate(specials)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t, _ in learned:
        if t not in vocab:
            vocab[t] = len(vocab)
    for t in chat:
        vocab[t] = len(vocab)
    merges = trained["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], unk_token="<unk>",
                               byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials + chat])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                        special_tokens=[("<s>", vocab["<s>"])])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>", pad_token=None)
    fast.chat_template = CHATML
    return fast, len(vocab)


def ids_of(out):
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(x) for x in out]


def long_prompts(tok):
    """Four text prompts of 30-80 tokens (past the 16-token window), plus the Unicode ones."""
    docs = [d for d in corpus() if len(d) > 60][:400]
    picked = []
    for d in docs[::17]:
        words = d.split()
        for n in range(6, len(words) + 1):
            text = " ".join(words[:n])
            k = len(tok(text)["input_ids"])
            if k >= 30:
                if k <= 80:
                    picked.append(text)
                break
        if len(picked) == 4:
            break
    assert len(picked) == 4, picked
    return picked


def greedy(model, ids, n=16):
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def main():
    from transformers import MistralConfig, MistralForCausalLM
    from peft import LoraConfig, get_peft_model
    meta = {"versions": VERSIONS, "chat_template": CHATML}
    tensors = {}

    # ------------------------------------------------ byte-fallback tokenizer + Mistral (window 16)
    tok, vocab = make_byte_fallback_tokenizer()
    mdir = os.path.join(OUT, "mistral-sw")
    cfg = MistralConfig(vocab_size=vocab, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                        sliding_window=16, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                        bos_token_id=1, eos_token_id=2)
    model = MistralForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    model.save_pretrained(mdir)
    gc = os.path.join(mdir, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)
    tok.save_pretrained(mdir)
    if not os.path.exists(os.path.join(mdir, "chat_template.jinja")):
        print("note: save_pretrained wrote no chat_template.jinja; writing it", os.listdir(mdir), flush=True)
        with open(os.path.join(mdir, "chat_template.jinja"), "w") as f:
            f.write(CHATML)
        tcp = os.path.join(mdir, "tokenizer_config.json")
        with open(tcp) as f:
            tcj = json.load(f)
        tcj.pop("chat_template", None)
        with open(tcp, "w") as f:
            json.dump(tcj, f, indent=2)
    try:  # goldens from the saved files, as users load them
        tok = transformers.AutoTokenizer.from_pretrained(mdir)
    except Exception as e:
        print("note: AutoTokenizer failed, using PreTrainedTokenizerFast:", repr(e), flush=True)
        tok = transformers.PreTrainedTokenizerFast.from_pretrained(mdir)
    meta["tokenizer_class"] = type(tok).__name__

    prompts = long_prompts(tok)
    meta["prompts"] = prompts
    m = {"prompts": {}}
    import copy
    cfg2 = copy.deepcopy(cfg)
    cfg2.sliding_window = None
    nowindow = MistralForCausalLM(cfg2).float().eval()
    nowindow.load_state_dict(model.state_dict())
    for i, text in enumerate(prompts):
        ids = tok(text)["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
            full = nowindow(input_ids=torch.tensor([ids])).logits[0].float()
        tensors[f"mistral.base.prompt{i}.logits"] = logits.contiguous()
        m["prompts"][f"prompt{i}"] = {"input_ids": ids, "greedy_new_ids": greedy(model, ids),
                                      "window_changes_logits": float((logits - full).abs().max())}
    meta["mistral.base"] = m

    # adapters a, b
    cfgs = {"a": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, init_lora_weights=False),
            "b": LoraConfig(r=2, lora_alpha=16, target_modules=["o_proj", "down_proj"], lora_dropout=0.0, init_lora_weights=False)}
    pm = None
    for name, c in cfgs.items():
        if pm is None:
            pm = get_peft_model(model, c, adapter_name=name)
        else:
            pm.add_adapter(name, c)
    pm.save_pretrained(os.path.join(mdir, "adapters"), selected_adapters=list(cfgs))
    for name in cfgs:
        pm.set_adapter(name)
        pm.eval()
        g = {"prompts": {}}
        for i, text in enumerate(prompts):
            ids = tok(text)["input_ids"]
            with torch.no_grad():
                tensors[f"mistral.{name}.prompt{i}.logits"] = pm(input_ids=torch.tensor([ids])).logits[0].float().contiguous()
            g["prompts"][f"prompt{i}"] = {"input_ids": ids, "greedy_new_ids": greedy(pm, ids)}
        meta[f"mistral.{name}"] = g
    pm.set_adapter("a")
    base_model = pm.get_base_model()

    # chat goldens on the Mistral (template from chat_template.jinja)
    meta["mistral.chat"] = []
    with pm.disable_adapter():
        for msgs in CHATS:
            ids = ids_of(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True))
            text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            meta["mistral.chat"].append({"messages": msgs, "text": text, "input_ids": ids,
                                         "greedy_new_ids": greedy(base_model, ids, 12),
                                         "no_generation_prompt_ids": ids_of(tok.apply_chat_template(msgs, tokenize=True))})
    meta["mistral.unicode"] = [{"text": t, "input_ids": tok(t)["input_ids"],
                                "decoded": tok.decode(tok(t)["input_ids"], skip_special_tokens=True)} for t in UNICODE_TEXTS]
    meta["mistral.byte_tokens"] = sum(1 for k in tok.get_vocab() if k.startswith("<0x"))

    try:
        # ------------------------------------------------ byte-level tokenizer with named chat templates
        bdir = os.path.join(OUT, "bytelevel-chat")
        os.makedirs(bdir, exist_ok=True)
        shutil.copy(os.path.join(BYTELEVEL_SRC, "tokenizer.json"), bdir)
        with open(os.path.join(BYTELEVEL_SRC, "tokenizer_config.json")) as f:
            tc = json.load(f)
        tc["chat_template"] = [{"name": "default", "template": PLAIN}, {"name": "tool_use", "template": TOOLS}]
        with open(os.path.join(bdir, "tokenizer_config.json"), "w") as f:
            json.dump(tc, f, indent=2)
        btok = transformers.AutoTokenizer.from_pretrained(bdir)
        b = {"chat": [], "unicode": []}
        for msgs in CHATS:
            b["chat"].append({"messages": msgs, "text": btok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False),
                              "input_ids": ids_of(btok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)),
                              "tool_use_ids": ids_of(btok.apply_chat_template(msgs, chat_template="tool_use", tokenize=True))})
        for t in UNICODE_TEXTS:
            ids = btok(t)["input_ids"]
            b["unicode"].append({"text": t, "input_ids": ids, "decoded": btok.decode(ids, skip_special_tokens=True)})
        meta["bytelevel"] = b


    except Exception as e:
        import traceback; traceback.print_exc()
        meta["bytelevel_error"] = repr(e)
    save_file(tensors, os.path.join(OUT, "golden.safetensors"))
    with open(os.path.join(OUT, "golden.json"), "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
    print("done", {k: len(v["input_ids"]) for k, v in meta["mistral.base"]["prompts"].items()},
          [v["window_changes_logits"] for v in meta["mistral.base"]["prompts"].values()], flush=True)


main()
