#!/usr/bin/env python3
"""The Hugging Face `tokenizers` side of test/sh/tok_families.sh.

  corpus DIR MB               writes DIR/train.txt (tokenizer training text) and DIR/docs.jsonl
                              (MB megabytes of multilingual documents): Latin with accents in
                              composed and decomposed forms, Cyrillic, Greek, CJK, Hangul (also as
                              jamo), Arabic, Devanagari, emoji, digit runs, whitespace runs,
                              fullwidth and compatibility characters (for NFKC), characters newer
                              than Unicode 9.0 with decompositions, special-token text
  train KIND DIR OUT.json     trains a small tokenizer of one family's shape on DIR/train.txt:
                              qwen2 (NFC; Split on the Qwen2 regex + ByteLevel), nfkc_digits
                              (NFKC; Digits individual + ByteLevel regex), runs (NFD; Digits runs +
                              Split on the Llama-3 regex + ByteLevel), llama2 (Prepend + Replace
                              normalizers, no pre-tokenizer, byte_fallback, SentencePiece decoder),
                              mistral (Metaspace prepend first, no split, byte_fallback, Metaspace
                              decoder), gemma (Replace normalizer, some <0xXX> missing: unk fused),
                              metasplit (Metaspace always + split, a Split on a string
                              MergedWithPrevious, Digits), unigram (NFKC, Metaspace, a Unigram
                              model with byte_fallback; <0x80>..<0x9F> missing: unk)
  check TOK.json EOT SHARDDIR OUT.ids FILE...
                              every token of the shards against tokenizers' encode of each
                              document + EOT; writes the documents' ids for the decode check (per
                              document u32 n, u32 k (a prompt whose text is whole characters), ids)
  autotokenizer (EXPORT SHARDS FILE)...
                              transformers' AutoTokenizer of each export encodes FILE's
                              documents to the shards' tokens (prints PASS/FAIL lines)
  decoded TOK.json IN.ids IN.out  test_tokenizer decode's output (per document: the whole text,
                              then the text of the ids after the first k) against tokenizers'
                              decode(ids) and decode(ids)[len(decode(ids[:k])):]
"""
import json
import os
import random
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe_reference  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3 = bpe_reference.LLAMA3

LATIN = "abcdefghijklmnopqrstuvwxyz" * 3 + "àáâãäåçèéêëìíîïñòóôõöùúûüýÿœßøæ" + "ABCDEFGHIJKLMNOPRSTUVW"
COMBINING = ["\u0300", "\u0301", "\u0302", "\u0303", "\u0308", "\u0327", "\u0323", "\u031b"]
SCRIPTS = {
    "cyr": "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГДЕЖЗИЙ",
    "greek": "αβγδεζηθικλμνξοπρστυφχψωάέήίόύώΑΒΓΔΩ",
    "cjk": "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年日本語東京漢字",
    "hangul": "한국어문장입니다가나다라마바사",
    "arabic": "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "deva": "कखगघचछजझटठडढणतथदधनपफबभमयरलवशषसह",
}
EMOJI = ["😀", "🎉", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "🤖", "1️⃣", "☃", "🏳️‍🌈", "🫠", "🪿"]
COMPAT = ["ｆｕｌｌｗｉｄｔｈ", "ＡＢＣ１２３", "ﬁﬂﬀ", "①②③", "㍿", "㎏㎡", "²³¹", "½¼", "Ⅻⅳ", "ｶﾀｶﾅ",
          "ﾞﾟ", "\u2126", "\u212b", "Å", "ǅ", "ſt", "\u3000", "…", "™", "㊗", "𝐁𝐨𝐥𝐝", "\u00a0x"]
NEWER = ["\u32ff", "\ua7f2", "\uab69", "\U00010781", "\U00011938", "\U00011935\U00011930",
         "a\U0001e130b", "\u1ac0"]  # decompositions / combining classes after Unicode 9.0
HANGUL_JAMO = ["\u1100\u1161", "\u1112\u1161\u11ab", "\u110b\u1165"]
SPECIAL_TEXT = ["<|endoftext|>", "<s>", "</s>", "<unk>", "<0x41>", "<|im_start|>"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", " \n ", "\r\n", "\u3000", "    "]


def word(rng):
    r = rng.random()
    if r < 0.30:
        w = "".join(rng.choice(LATIN) for _ in range(rng.randint(1, 9)))
        if rng.random() < 0.3:  # decomposed accents: NFC composes them, NFD keeps them apart
            i = rng.randint(0, len(w))
            w = w[:i] + "".join(rng.choice(COMBINING) for _ in range(rng.randint(1, 2))) + w[i:]
        return w
    if r < 0.62:
        alpha = SCRIPTS[rng.choice(list(SCRIPTS))]
        return "".join(rng.choice(alpha) for _ in range(rng.randint(1, 7)))
    if r < 0.70:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 12)))
    if r < 0.76:
        return rng.choice(EMOJI)
    if r < 0.84:
        return rng.choice(COMPAT)
    if r < 0.86:
        return rng.choice(NEWER + HANGUL_JAMO)
    if r < 0.88:
        return rng.choice(SPECIAL_TEXT)
    if r < 0.95:
        return rng.choice([".", ",", "!", "?", "'s", "-", "—", "«»", "(x)", "$5", "a-b", "▁"])
    return rng.choice(SPACES)


def make_text(rng, words, n):
    seps = [" "] * 12 + SPACES
    out = rng.choices(words, k=n)
    gaps = rng.choices(seps, k=n)
    return "".join(w + g for w, g in zip(out, gaps))


def corpus(d, mb):
    rng = random.Random(20251206)
    words = [word(rng) for _ in range(6000)]
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "train.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(make_text(rng, words, 60000))
    target, size = int(float(mb) * 1e6), 0
    with open(os.path.join(d, "docs.jsonl"), "w", encoding="utf-8") as f:
        while size < target:
            doc = make_text(rng, words, rng.randint(1, 1200))
            if rng.random() < 0.1:
                doc = " " + doc  # a document starting with a space
            line = json.dumps({"text": doc}, ensure_ascii=False) + "\n"
            size += len(line.encode())
            f.write(line)


def byte_tokens(path, missing=()):
    """Adds <0x00>..<0xFF> (less missing) to a trained vocabulary, after its entries."""
    j = json.load(open(path, encoding="utf-8"))
    v = j["model"]["vocab"]
    n = max(v.values()) + 1
    for b in range(256):
        if b not in missing:
            v["<0x%02X>" % b] = n
            n += 1
    json.dump(j, open(path, "w", encoding="utf-8"), ensure_ascii=False)


def train_spm(kind, chunks, out):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tr = trainers.BpeTrainer(vocab_size=1500, special_tokens=["<unk>", "<s>", "</s>"],
                             limit_alphabet=150, show_progress=False)
    tok.train_from_iterator(chunks, tr)
    sp_dec = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if kind == "llama2":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.pre_tokenizer = None
        tok.decoder = decoders.Sequence(sp_dec + [decoders.Strip(" ", 1, 0)])
    elif kind == "mistral":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(prepend_scheme="first")])
    elif kind == "gemma":
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.pre_tokenizer = None
        tok.decoder = decoders.Sequence(sp_dec)
    else:  # metasplit
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split("-", behavior="merged_with_previous"),
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
            pre_tokenizers.Digits(individual_digits=False)])
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(prepend_scheme="always")])
    tok.save(out)
    byte_tokens(out, missing=range(0x80, 0x90) if kind == "gemma" else ())


def train_unigram(chunks, out):
    """T5-style Unigram: NFKC, Metaspace (always, split), byte_fallback with <0xXX> pieces (scored
    below every other piece, as SentencePiece does), unk for the rest."""
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(prepend_scheme="always")])
    tr = trainers.UnigramTrainer(vocab_size=1200, special_tokens=["<unk>", "<s>", "</s>"],
                                 unk_token="<unk>", show_progress=False)
    tok.train_from_iterator(chunks[:60], tr)
    tok.save(out)
    j = json.load(open(out, encoding="utf-8"))
    m = j["model"]
    # characters without a piece of their own: their bytes (byte fallback), or with a byte among
    # the missing <0x80>..<0x9F> (as in 的 E7 9A 84) unk, fused over consecutive ones
    m["vocab"] = [v for v in m["vocab"] if v[0] not in set("的一是不了人我在αβγδабвгاب")]
    ids = {p: i for i, (p, _) in enumerate(m["vocab"])}
    for a in j["added_tokens"]:
        a["id"] = ids[a["content"]]
    low = min(sc for _, sc in m["vocab"])
    m["vocab"] += [["<0x%02X>" % b, low - 1.0] for b in range(256) if b < 0x80 or b >= 0xA0]
    m["byte_fallback"] = True
    json.dump(j, open(out, "w", encoding="utf-8"), ensure_ascii=False)


def train(kind, d, out):
    text = open(os.path.join(d, "train.txt"), encoding="utf-8", newline="").read()
    chunks = [text[i:i + 2000] for i in range(0, len(text), 2000)]
    if kind == "unigram":
        return train_unigram(chunks, out)
    if kind in ("llama2", "mistral", "gemma", "metasplit"):
        return train_spm(kind, chunks, out)
    tok = Tokenizer(models.BPE())
    if kind == "qwen2":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif kind == "nfkc_digits":
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif kind == "runs":
        tok.normalizer = normalizers.Sequence([normalizers.NFD()])
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=False),
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        sys.exit("unknown kind " + kind)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=1500, special_tokens=["<|endoftext|>", "<|im_start|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(chunks, tr)
    tok.save(out)


def prompt_len(tok, x):
    """The first k >= 1 whose decoded text is whole characters (a prompt to continue)."""
    k = 1
    while k < len(x) and "\ufffd" in tok.decode(x[:k], skip_special_tokens=False):
        k += 1
    return min(k, len(x))


def check(tok_path, eot, shard_dir, ids_out, files):
    """bpe_reference.check's comparison, encoding once (encode_batch), and the ids for decode."""
    tok = Tokenizer.from_file(tok_path)
    docs = [d for f in files for d in bpe_reference.documents(f)]
    enc = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
    want = []
    for x in enc:
        want += x + [int(eot)]
    got = bpe_reference.read_shards(shard_dir, "train") + bpe_reference.read_shards(shard_dir, "val")
    if got != want:
        i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        ctx = lambda ids: repr(tok.decode(ids[max(0, i - 8):i + 8], skip_special_tokens=False))
        sys.exit("token %d differs (%d and %d tokens): ustrain %s %s\n  tokenizers %s %s"
                 % (i, len(got), len(want), got[max(0, i - 8):i + 8], ctx(got), want[max(0, i - 8):i + 8], ctx(want)))
    with open(ids_out, "wb") as f:
        for x in enc:
            f.write(struct.pack("<2I%dI" % len(x), len(x), prompt_len(tok, x), *x))
    print("ok: %d tokens identical in %d documents" % (len(got), len(docs)))


def decoded(tok_path, ids_path, got_path):
    """test_tokenizer decode's output (per document: u32 n + the whole text, u32 n + the text of
    the ids after the prompt) against decode(ids) and decode(ids)[len(decode(ids[:k])):]."""
    tok = Tokenizer.from_file(tok_path)
    raw, got = open(ids_path, "rb").read(), open(got_path, "rb").read()
    off = goff = n_docs = nbytes = 0
    while off < len(raw):
        n, k = struct.unpack_from("<2I", raw, off)
        x = list(struct.unpack_from("<%dI" % n, raw, off + 8))
        off += 8 + 4 * n
        parts = []
        for _ in range(2):
            (m,) = struct.unpack_from("<I", got, goff)
            parts.append(got[goff + 4:goff + 4 + m])
            goff += 4 + m
        want = tok.decode(x, skip_special_tokens=False).encode()
        if parts[0] != want:
            j = next((j for j in range(min(len(want), len(parts[0]))) if want[j] != parts[0][j]), 0)
            sys.exit("document %d: decode differs at byte %d\n  ustrain:    %r\n  tokenizers: %r"
                     % (n_docs, j, parts[0][max(0, j - 30):j + 30], want[max(0, j - 30):j + 30]))
        head = tok.decode(x[:k], skip_special_tokens=False).encode()
        if head + parts[1] != want:
            sys.exit("document %d: the ids after the first %d do not stream to the rest of the "
                     "text:\n  %r\n  %r" % (n_docs, k, (head + parts[1])[:120], want[:120]))
        n_docs += 1
        nbytes += len(want)
    if goff != len(got):
        sys.exit("%d bytes left over in %s" % (len(got) - goff, got_path))
    print("ok: %d documents (%d bytes) decode identically" % (n_docs, nbytes))


def autotokenizer(cases):
    """cases: EXPORT_DIR SHARD_DIR FILE triples. transformers' AutoTokenizer.from_pretrained of
    each export must encode every document of FILE (add_special_tokens=False, then the end of
    text) to the shards' tokens, decode them as tokenizers does, and name the end of text as
    eos/pad."""
    import transformers
    bad = 0
    for out, shards, path in zip(cases[0::3], cases[1::3], cases[2::3]):
        tok = transformers.AutoTokenizer.from_pretrained(out)
        eot = json.load(open(os.path.join(shards, "meta.json")))["eot_id"]
        mt = json.load(open(os.path.join(out, "config.json")))["model_type"]
        docs = list(bpe_reference.documents(path))
        want = bpe_reference.read_shards(shards, "train") + bpe_reference.read_shards(shards, "val")
        ref = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
        got, differ = [], 0
        for d in docs:
            x = tok.encode(d, add_special_tokens=False)
            differ += tok.decode(x, skip_special_tokens=False) != ref.decode(x, skip_special_tokens=False)
            got += x + [eot]
        name = "%s (%s, %s)" % (os.path.basename(out), mt, type(tok).__name__)
        if got != want:
            i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            print("FAIL tok_export_%s_autotokenizer_encodes_as_the_training_data: %s: token %d of %d "
                  "differs: %s vs %s" % (os.path.basename(out), name, i, len(want), got[i:i + 5], want[i:i + 5]))
            bad += 1
        else:
            print("PASS tok_export_%s_autotokenizer_encodes_as_the_training_data" % os.path.basename(out))
        ok = differ == 0 and tok.eos_token_id == eot and tok.pad_token_id == eot
        print("%s tok_export_%s_autotokenizer_decodes_and_names_the_end_of_text%s" % (
            "PASS" if ok else "FAIL", os.path.basename(out),
            "" if ok else ": %d documents decode otherwise than tokenizers, eos %s pad %s, want %d" % (
                differ, tok.eos_token_id, tok.pad_token_id, eot)))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "corpus":
        corpus(*args)
    elif cmd == "train":
        train(*args)
    elif cmd == "check":
        check(args[0], args[1], args[2], args[3], args[4:])
    elif cmd == "decoded":
        decoded(*args)
    elif cmd == "autotokenizer":
        autotokenizer(args)
    else:
        sys.exit(__doc__)
