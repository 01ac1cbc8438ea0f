#!/usr/bin/env python3
"""The Hugging Face `tokenizers` side of test/sh/data_prep_bpe.sh.

  corpus DIR                       writes the test corpus: train.txt (tokenizer training text),
                                   plain.txt, docs.jsonl and long.txt (the text to prepare)
  train KIND DIR OUT.json          trains a small byte-level BPE tokenizer on DIR/train.txt;
                                   KIND: gpt2 (ByteLevel regex), llama3 (Split on the Llama-3
                                   regex + ByteLevel, ignore_merges), prefix (ByteLevel with
                                   add_prefix_space, lstrip/rstrip added tokens, no byte alphabet)
  legacy IN.json OUT.json          the same tokenizer with merges written as "a b" strings
  check TOK.json EOT SHARDDIR FILE...
                                   encodes every document (a .jsonl line, or a whole file) with
                                   `tokenizers`, appends EOT after each, and compares the stream
                                   with SHARDDIR/train_*.bin + val_*.bin token by token
"""
import glob
import json
import os
import random
import struct
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from tokenizers import AddedToken

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

WORDS = ("the a of and to in is it that was for on are with as I his they be at one have this "
         "from or had by hot word but what some we can out other were all there when up use your "
         "how said an each she which do their time if will way about many then them write would "
         "like so these her long make thing see him two has look more day could go come did "
         "number sound no most people my over know water than call first who may down side been "
         "now find any new work part take get place made live where after back little only round "
         "man year came show every good me give our under name very through just form sentence "
         "great think say help low line differ turn cause much mean before move right boy old too "
         "same tell does set three want air well also play small end put home read hand port large "
         "spell add even land here must big high such follow act why ask men change went light "
         "kind off need house picture try us again animal point mother world near build self earth "
         "father head stand own page should country found answer school grow study still learn "
         "plant cover food sun four between state keep eye never last let thought city tree cross "
         "farm hard start might story saw far sea draw left late run don't while press close night "
         "real life few north").split()
CONTRACTIONS = ["don't", "I'm", "they'll", "we've", "she'd", "it's", "you're", "WE'RE", "IT'S",
                "They'LL", "o'clock", "rock'n'roll", "'s", "''s", "'tis", "'ſ", "ma'am", "isn’t",
                "can't't", "'re'", "'ve's", "' s", "'S'T'M'D"]
UNICODE = ["naïve café", "Привет мир", "日本語のテキストです", "한국어 문장", "مرحبا بالعالم",
           "हिन्दी भाषा", "ภาษาไทย", "e\u0301le\u0300ve", "ß straße ẞ", "Ωμέγα", "ﬁnance ﬀ",
           "Ⅻ chapters", "½ cup", "x² + y³", "١٢٣٤٥ ٦", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "Ꭰꮳꮃ", "𐐷𐑌", "ǅungla",
           "\u00ad soft\u00adhyphen", "zero\u200bwidth", "a\u200db"]
EMOJI = ["😀", "🎉🎉", "👍🏽", "👨‍👩‍👧", "🇫🇷🇩🇪", "❤️", "🤖x", "1️⃣", "☃", "🏳️‍🌈"]
PUNCT = ["...", "!!!", "?!", "—", "«quoted»", "(paren)", "[x]", "{y}", "<tag>", "#hash", "@user",
         "a/b\\c", "__init__", "--flag", "x=1;", "$5.00", "100%", "e.g.", "'quote'", "\"dq\"",
         "<|endoftext|>", "<|end", "<|end_of_text|>", "<|pad|>"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", " \n", "  \n  ", "\r\n",
          "\r\n\r\n", "\u00a0", "\u3000", "\u2028", "\u0085", " \t \n", "\v", "\f", "    "]
NUMBERS = ["12345", "3.14159", "1,000,000", "2024-05-20", "0x1F", "007", "42", "9999999999",
           "+1 (555) 010-9999", "1e-9", "١٢٣"]


def make_doc(rng, nwords):
    out = []
    for _ in range(nwords):
        r = rng.random()
        if r < 0.55:
            w = rng.choice(WORDS)
            w = w.capitalize() if rng.random() < 0.1 else w.upper() if rng.random() < 0.03 else w
        elif r < 0.65:
            w = rng.choice(CONTRACTIONS)
        elif r < 0.75:
            w = rng.choice(UNICODE)
        elif r < 0.80:
            w = rng.choice(EMOJI)
        elif r < 0.88:
            w = rng.choice(PUNCT)
        elif r < 0.95:
            w = rng.choice(NUMBERS)
        else:
            w = "".join(rng.choice(SPACES) for _ in range(rng.randint(1, 3)))
        out.append(w)
        out.append(rng.choice(SPACES) if rng.random() < 0.15 else " ")
    return "".join(out)


def corpus(d):
    rng = random.Random(20240520)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "train.txt"), "w", encoding="utf-8", newline="") as f:
        f.write("\n".join(make_doc(rng, 200) for _ in range(150)))
    with open(os.path.join(d, "plain.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(make_doc(rng, 3000))
    with open(os.path.join(d, "docs.jsonl"), "w", encoding="utf-8") as f:
        for i in range(120):
            f.write(json.dumps({"id": i, "text": make_doc(rng, rng.randint(0, 300))}) + "\n")
            if i % 40 == 0:
                f.write("\n")  # blank lines are skipped
    with open(os.path.join(d, "long.txt"), "w", encoding="utf-8", newline="") as f:
        # lines with a printable character on both sides of many newlines: cut points
        f.write("\n".join(make_doc(rng, 40).replace("\n", " ") + "." for _ in range(400)))


def train(kind, d, out):
    text = open(os.path.join(d, "train.txt"), encoding="utf-8", newline="").read()
    chunks = [text[i:i + 2000] for i in range(0, len(text), 2000)]
    if kind == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        special = ["<|endoftext|>"]
    elif kind == "llama3":
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        special = ["<|begin_of_text|>", "<|end_of_text|>"]
    elif kind == "prefix":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        special = ["<|endoftext|>"]
    else:
        sys.exit("unknown kind " + kind)
    tok.decoder = decoders.ByteLevel()
    alphabet = [] if kind == "prefix" else pre_tokenizers.ByteLevel.alphabet()
    tr = trainers.BpeTrainer(vocab_size=1200, special_tokens=special, initial_alphabet=alphabet,
                             show_progress=False)
    tok.train_from_iterator(chunks, tr)
    if kind == "prefix":  # added tokens with whitespace stripping and word boundaries
        tok.add_tokens([AddedToken("<|pad|>", lstrip=True, rstrip=True),
                        AddedToken("cafe", single_word=True), AddedToken("ing", normalized=True)])
    tok.save(out)


def legacy(src, dst):
    j = json.load(open(src, encoding="utf-8"))
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    json.dump(j, open(dst, "w", encoding="utf-8"), ensure_ascii=False)


def documents(path):
    if path.endswith(".jsonl"):
        for line in open(path, encoding="utf-8"):
            if line.strip():
                yield json.loads(line)["text"]
    else:
        yield open(path, encoding="utf-8", newline="").read()


def read_shards(d, split):
    ids = []
    for p in sorted(glob.glob(os.path.join(d, split + "_*.bin"))):
        b = open(p, "rb").read()
        magic, version, n = struct.unpack("<3i", b[:12])
        width = {20240520: 2, 20240801: 4}[magic]
        assert version == 1 and len(b) == 1024 + n * width, (p, version, n, len(b))
        ids += list(struct.unpack("<%d%s" % (n, "H" if width == 2 else "I"), b[1024:]))
    return ids


def check(tok_path, eot, shard_dir, files):
    tok = Tokenizer.from_file(tok_path)
    want = []
    for f in files:
        for doc in documents(f):
            want += tok.encode(doc, add_special_tokens=False).ids + [int(eot)]
    train_ids, val_ids = read_shards(shard_dir, "train"), read_shards(shard_dir, "val")
    got = train_ids + val_ids
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            ctx = lambda ids: repr(tok.decode(ids[max(0, i - 8):i + 8], skip_special_tokens=False))
            sys.exit("token %d differs: ustrain %d, tokenizers %d\n  ustrain:    %s %s\n  "
                     "tokenizers: %s %s" % (i, a, b, got[max(0, i - 8):i + 8], ctx(got),
                                            want[max(0, i - 8):i + 8], ctx(want)))
    if len(got) != len(want):
        sys.exit("ustrain wrote %d tokens, tokenizers gives %d" % (len(got), len(want)))
    nval = int(0.1 * len(want) + 0.5)
    if len(val_ids) != nval:
        sys.exit("val has %d tokens, expected the last 10%% = %d" % (len(val_ids), nval))
    print("ok: %d tokens identical (%d train, %d val)" % (len(got), len(train_ids), len(val_ids)))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "corpus":
        corpus(*args)
    elif cmd == "train":
        train(*args)
    elif cmd == "legacy":
        legacy(*args)
    elif cmd == "check":
        check(args[0], args[1], args[2], args[3:])
    else:
        sys.exit(__doc__)
