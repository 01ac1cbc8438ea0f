#!/usr/bin/env python3
"""Reference for `ustrain data prep --chat`: transformers' apply_chat_template with each built-in
family's Jinja chat_template, on a small byte-level BPE tokenizer (Llama-3 split) that holds every
template's special tokens.

  chat_reference.py make DIR             DIR/{chatml,llama3,mistral,gemma3}/ (tokenizer.json and
                                         tokenizer_config.json with the family's template) and
                                         DIR/convs.jsonl (conversations and prompt/completion pairs)
  chat_reference.py check TOKDIR SHARDS JSONL [--train-on assistant|completion|all]
      every token of SHARDS (train then val) equals apply_chat_template(messages, tokenize=True)
      of each line followed by the end of text, and each target flag is set exactly on the tokens
      that end inside a trained turn's content and end token (offsets of the rendered text)"""
import glob
import json
import os
import random
import struct
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
           "<|end_header_id|>", "<|eot_id|>", "<s>", "</s>", "[INST]", "[/INST]", "<bos>",
           "<start_of_turn>", "<end_of_turn>"]

# The families' chat templates (text content only), as their tokenizer_config.json ship them.
TEMPLATES = {
    "chatml": ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
               "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
               "{{ '<|im_start|>assistant\\n' }}{% endif %}", None, "<|im_end|>"),
    "llama3": ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
               "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] "
               "| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
               "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
               "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
               "<|begin_of_text|>", "<|eot_id|>"),
    "mistral": ("{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
                "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}"
                "{%- endif %}{{- bos_token }}{%- for message in loop_messages %}"
                "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{- raise_exception("
                "'After the optional system message, conversation roles must alternate "
                "user/assistant/user/assistant/...') }}{%- endif %}{%- if message['role'] == 'user' %}"
                "{%- if loop.first and system_message is defined %}{{- ' [INST] ' + system_message + "
                "'\\n\\n' + message['content'] + ' [/INST]' }}{%- else %}{{- ' [INST] ' + "
                "message['content'] + ' [/INST]' }}{%- endif %}{%- elif message['role'] == 'assistant' %}"
                "{{- ' ' + message['content'] + eos_token}}{%- else %}{{- raise_exception('Only user "
                "and assistant roles are supported, with the exception of an initial optional system "
                "message!') }}{%- endif %}{%- endfor %}", "<s>", "</s>"),
    "gemma3": ("{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = "
               "messages[0]['content'] + '\\n\\n' -%}{%- set loop_messages = messages[1:] -%}{%- else -%}"
               "{%- set first_user_prefix = \"\" -%}{%- set loop_messages = messages -%}{%- endif -%}"
               "{%- for message in loop_messages -%}{%- if (message['role'] == 'user') != "
               "(loop.index0 % 2 == 0) -%}{{ raise_exception(\"Conversation roles must alternate "
               "user/assistant/user/assistant/...\") }}{%- endif -%}{%- if (message['role'] == "
               "'assistant') -%}{%- set role = \"model\" -%}{%- else -%}{%- set role = message['role'] -%}"
               "{%- endif -%}{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first "
               "else \"\") }}{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}{%- endfor -%}"
               "{%- if add_generation_prompt -%}{{'<start_of_turn>model\\n'}}{%- endif -%}", "<bos>",
               "<end_of_turn>"),
}
TRIM = {"llama3", "gemma3"}


def words(rng, n):
    w = ["the", "cat", "sits", "on", "a", "mat", "Hello", "world", "42", "über", "naïve", "日本",
         "don't", "it's", "!", "?", ",", "code:", "x = 1;", "   ", "\n", "\t"]
    return " ".join(rng.choice(w) for _ in range(n))


def convs(path):
    rng = random.Random(11)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(60):
            ms = []
            if i % 3 == 0:
                ms.append({"role": "system", "content": words(rng, rng.randint(2, 8))})
            for t in range(rng.randint(1, 3)):
                u, a = words(rng, rng.randint(1, 10)), words(rng, rng.randint(1, 12))
                if i % 7 == 0:
                    a = "  " + a + "\n"  # whitespace the trimming templates drop
                ms += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
            line = {"messages": ms}
            if i % 10 == 4:
                line["tools"] = [{"type": "function", "function": {"name": "f"}}]
            if i % 5 == 2:
                line = {"prompt": words(rng, 5), "completion": words(rng, 6)}
            f.write(json.dumps(line, ensure_ascii=False) + "\n")


def make(d):
    rng = random.Random(3)
    text = [words(rng, 30) for _ in range(400)]
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIAL,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(text, tr)
    for kind, (tpl, bos, eos) in TEMPLATES.items():
        os.makedirs(f"{d}/{kind}", exist_ok=True)
        tok.save(f"{d}/{kind}/tokenizer.json")
        cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": tpl,
               "bos_token": bos, "eos_token": eos, "model_max_length": 1 << 20}
        json.dump(cfg, open(f"{d}/{kind}/tokenizer_config.json", "w"))
    convs(f"{d}/convs.jsonl")


def read_shards(d):
    ids, flags = [], []
    for split in ("train", "val"):
        for p in sorted(glob.glob(os.path.join(d, split + "_*.bin"))):
            b = open(p, "rb").read()
            magic, version, n = struct.unpack("<3i", b[:12])
            assert magic == 20240520 and version == 2 and len(b) == 1024 + 2 * n + (n + 7) // 8, (p, version)
            ids += struct.unpack("<%dH" % n, b[1024:1024 + 2 * n])
            bits = b[1024 + 2 * n:]
            flags += [(bits[i >> 3] >> (i & 7)) & 1 for i in range(n)]
    return ids, flags


def expected(tok, kind, line, train_on, eot):
    ms = line.get("messages") or [{"role": "user", "content": line["prompt"]},
                                   {"role": "assistant", "content": line["completion"]}]
    ids = tok.apply_chat_template(ms, tokenize=True)
    if not isinstance(ids, list):  # newer transformers return a BatchEncoding
        ids = ids["input_ids"]
    text = tok.apply_chat_template(ms, tokenize=False)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == ids, "the rendered text tokenizes otherwise"
    end = TEMPLATES[kind][2]
    spans, pos = [], 0
    last = max(i for i, m in enumerate(ms) if m["role"] == "assistant")
    for i, m in enumerate(ms):
        if m["role"] == "system" and kind in ("mistral", "gemma3"):
            continue  # it joins the first user turn
        c = m["content"].strip() if kind in TRIM else m["content"]
        e = " [/INST]" if kind == "mistral" and m["role"] == "user" else end
        at = text.index(c + e, pos)  # each turn's content, in order
        pos = at + len(c) + len(e)
        if m["role"] == "assistant" and (train_on == "assistant" or i == last):
            spans.append((at, pos))
    flags = [int(train_on == "all" or any(a < e <= b for a, b in spans)) for s, e in enc["offset_mapping"]]
    return ids + [eot], flags + [int(train_on == "all")]


def check(tokdir, shards, jsonl, train_on):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tokdir)
    kind = os.path.basename(os.path.normpath(tokdir))
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    want_ids, want_flags = [], []
    for line in open(jsonl, encoding="utf-8"):
        i, f = expected(tok, kind, json.loads(line), train_on, eot)
        want_ids += i
        want_flags += f
    ids, flags = read_shards(shards)
    if list(ids) != want_ids:
        k = next((i for i, (a, b) in enumerate(zip(ids, want_ids)) if a != b), min(len(ids), len(want_ids)))
        sys.exit(f"{kind}: token {k} differs: ustrain {list(ids[k:k + 6])} transformers "
                 f"{want_ids[k:k + 6]} ({len(ids)} vs {len(want_ids)} tokens) near "
                 f"{tok.decode(want_ids[max(0, k - 6):k + 6])!r}")
    if flags != want_flags:
        k = next(i for i, (a, b) in enumerate(zip(flags, want_flags)) if a != b)
        sys.exit(f"{kind}: target flag of token {k} is {flags[k]}, expected {want_flags[k]} near "
                 f"{tok.decode(want_ids[max(0, k - 6):k + 1])!r}")
    print(f"{kind}: {len(ids)} tokens, {sum(flags)} targets equal")


def model(out, vocab):
    """A tiny Qwen2 (q/k/v biases, tied embeddings off) of random weights, saved for import."""
    import torch
    import transformers as tf
    torch.manual_seed(5)
    m = tf.Qwen2ForCausalLM(tf.Qwen2Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=vocab, max_position_embeddings=256, rms_norm_eps=1e-5,
        tie_word_embeddings=False))
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.05 * torch.randn_like(p))
    m.save_pretrained(out, safe_serialization=True)


def masked_loss(model_dir, shard, T, nwin):
    """transformers' loss over windows 0..nwin-1 of T+1 tokens of shard, labels -100 where the
    shard's mask does not flag the target: the mean over the whole batch's targets."""
    import torch
    import transformers as tf
    m = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    b = open(shard, "rb").read()
    n = struct.unpack("<3i", b[:12])[2]
    ids = struct.unpack("<%dH" % n, b[1024:1024 + 2 * n])
    bits = b[1024 + 2 * n:]
    flag = lambda i: (bits[i >> 3] >> (i & 7)) & 1
    x = torch.tensor([ids[k * T:k * T + T + 1] for k in range(nwin)])
    lab = torch.tensor([[-100] + [ids[k * T + p] if flag(k * T + p) else -100 for p in range(1, T + 1)]
                        for k in range(nwin)])
    with torch.no_grad():
        loss = m(input_ids=x, labels=lab).loss
    print(f"{float(loss):.9g} {int((lab != -100).sum())}")


def example_loss(model_dir, shard_dir, eot):
    """transformers' loss over every example of the shards (train then val; an example ends with
    the end of text) run alone, labels -100 where the mask is off and at the example's first
    token: "loss targets", the mean over all examples' targets."""
    import torch
    import transformers as tf
    m = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids, flags = read_shards(shard_dir)
    total, count, begin = 0.0, 0, 0
    for end in [i + 1 for i, t in enumerate(ids) if t == eot]:
        x = torch.tensor([ids[begin:end]])
        lab = torch.tensor([[-100] + [ids[i] if flags[i] == 1 else -100 for i in range(begin + 1, end)]])
        n = int((lab != -100).sum())
        if n:
            with torch.no_grad():
                total += float(m(input_ids=x, labels=lab).loss) * n
            count += n
        begin = end
    print(f"{total / count:.9g} {count}")


def mc_items(path):
    rng = random.Random(9)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(12):
            ch = [words(rng, rng.randint(1, 6)) for _ in range(rng.choice([2, 3, 4]))]
            if i % 4 == 3:  # llm.c's HellaSwag line: endings scored with a leading space
                f.write(json.dumps({"ind": i, "ctx": words(rng, 8), "endings": ch, "label": i % len(ch)}) + "\n")
            else:
                f.write(json.dumps({"context": words(rng, rng.randint(1, 12)), "choices": ch,
                                    "label": (i * 7) % len(ch)}) + "\n")


def mc_check(model_dir, tok_path, task, scores):
    """Every choice's log-likelihood after its context, as transformers computes it, against
    ustrain's --scores lines (1e-4 relative, the fp32 sum over a few tokens), and the same
    predictions."""
    import torch
    import transformers as tf
    from tokenizers import Tokenizer
    m = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = Tokenizer.from_file(tok_path)
    got = [json.loads(l) for l in open(scores)]
    items = [json.loads(l) for l in open(task) if l.strip()]
    assert len(got) == len(items), (len(got), len(items))
    worst = 0.0
    for item, g in zip(items, got):
        ctx = item.get("context", item.get("ctx"))
        chs = item["choices"] if "choices" in item else [" " + e for e in item["endings"]]
        c = tok.encode(ctx, add_special_tokens=False).ids
        lls = []
        for ch in chs:
            x = tok.encode(ch, add_special_tokens=False).ids
            with torch.no_grad():
                lp = torch.log_softmax(m(torch.tensor([c + x])).logits[0].double(), -1)
            lls.append(float(sum(lp[len(c) - 1 + j, t] for j, t in enumerate(x))))
        for a, b in zip(g["loglik"], lls):
            worst = max(worst, abs(a - b) / abs(b))
        pred = max(range(len(lls)), key=lambda k: lls[k])
        norm = max(range(len(lls)), key=lambda k: lls[k] / len(chs[k]))
        assert g["pred"] == pred and g["pred_norm"] == norm, (g, lls)
    assert worst <= 1e-4, worst
    print(f"{len(items)} items: every log-likelihood within {worst:.2e} relative, the same predictions")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "model":
        model(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "mc-items":
        mc_items(sys.argv[2])
    elif sys.argv[1] == "mc-check":
        mc_check(*sys.argv[2:6])
    elif sys.argv[1] == "examples":
        example_loss(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "loss":
        masked_loss(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        on = sys.argv[sys.argv.index("--train-on") + 1] if "--train-on" in sys.argv else "assistant"
        check(sys.argv[2], sys.argv[3], sys.argv[4], on)
