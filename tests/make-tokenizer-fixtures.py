#!/usr/bin/env python3
"""Regenerates tests/fixtures/tokenizer-<family>-ids.json: the expected token ids of
tests/fixtures/tokenizer-text.txt (and of a few chat conversations) under a real GGUF vocabulary,
computed with HF `tokenizers` - an independent implementation - built from the GGUF's
tokenizer.ggml.* metadata:
  * qwen  (tokenizer.ggml.model gpt2, pre qwen2): BPE with the GGUF's vocab and merges, NFC, the
    Qwen2 pre-tokenizer regex (Split, isolated) + ByteLevel; chats rendered with the GGUF's own
    Jinja chat template.
  * gemma (tokenizer.ggml.model llama): BPE with byte fallback, ' ' -> U+2581, merges derived from
    the scores as transformers' SentencePieceExtractor does, <bos> prepended; chats rendered by
    hand in Gemma 3's format. When `sentencepiece` and `protobuf` are importable, the ids are also
    checked against SentencePiece itself (a model proto built from the same pieces and scores).
Only ids are written, never the vocabulary.

Usage: tests/fetch-real-models.sh DIR
       pip install tokenizers jinja2 [sentencepiece protobuf]
       python3 tests/make-tokenizer-fixtures.py DIR/*.gguf
"""
import hashlib
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT_PATH = os.path.join(HERE, "fixtures", "tokenizer-text.txt")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

CHATS = [
    dict(messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]),
    dict(messages=[{"role": "system", "content": "You are terse."},
                   {"role": "user", "content": "What is 2+2?"},
                   {"role": "assistant", "content": "4"},
                   {"role": "user", "content": "And 3+3?  "},
                   {"role": "assistant", "content": "\n\n  6 \n"}]),
    dict(messages=[{"role": "user", "content": "Write hello world in C.\n"}], add_generation_prompt=True),
    dict(messages=[{"role": "user", "content": "Ünïcödé ✨ 你好"},
                   {"role": "assistant", "content": "int main() {\n    return 0;\n}"}]),
]


def read_gguf_metadata(path):
    """The key/value metadata of a GGUF v2/v3 file (tensor infos are not read)."""
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    with open(path, "rb") as f:
        def rd(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))

        def rstr():
            (n,) = rd("Q")
            return f.read(n).decode("utf-8", errors="surrogateescape")

        def rval(t):
            if t in scalar:
                return rd(scalar[t])[0]
            if t == 8:
                return rstr()
            if t == 9:
                et, n = rd("I")[0], rd("Q")[0]
                if et in scalar:
                    return list(struct.unpack("<%d%s" % (n, scalar[et]), f.read(n * struct.calcsize(scalar[et]))))
                return [rval(et) for _ in range(n)]
            raise ValueError(f"{path}: unknown GGUF value type {t}")

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        rd("I")
        _, n_kv = rd("QQ")
        meta = {}
        for _ in range(n_kv):
            key = rstr()
            meta[key] = rval(rd("I")[0])
        return meta


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def added_tokens(tokens, types):
    from tokenizers import AddedToken
    out = []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty in (CONTROL, UNKNOWN) and t:
            out.append(AddedToken(t, special=True, normalized=False))
        elif ty == USER_DEFINED and t:
            out.append(AddedToken(t, special=False, normalized=False))
    return out


def build_qwen(meta):
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(BPE(vocab=vocab, merges=merges))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens(added_tokens(tokens, types))
    return tok


def spm_merges(tokens, types, scores):
    """Merges in priority order from pieces and scores (transformers' SentencePieceExtractor):
    every split of a regular piece into two vocabulary pieces, by the piece's score."""
    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}
    merges = []
    for piece, i in vocab.items():
        if types[i] != NORMAL:
            continue
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend((scores[i], m) for m in local)
    merges.sort(key=lambda x: -x[0])  # stable: equal scores keep the order above
    return vocab, [m for _, m in merges]


def build_gemma(meta):
    from tokenizers import Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE
    tokens, types, scores = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"], meta["tokenizer.ggml.scores"]
    vocab, merges = spm_merges(tokens, types, scores)
    unk = tokens[meta["tokenizer.ggml.unknown_token_id"]]
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token=unk, byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_tokens(added_tokens(tokens, types))
    if meta.get("tokenizer.ggml.add_bos_token", True):
        bos = meta["tokenizer.ggml.bos_token_id"]
        tok.post_processor = processors.TemplateProcessing(single=f"{tokens[bos]} $A", special_tokens=[(tokens[bos], bos)])
    return tok


def check_with_sentencepiece(meta, lines, expected):
    """SentencePiece's own BPE encoder on a model proto holding the GGUF pieces: must agree."""
    try:
        import sentencepiece as spm
        from sentencepiece import sentencepiece_model_pb2 as pb
    except ImportError:
        print("  sentencepiece/protobuf not importable: SentencePiece cross-check skipped")
        return
    m = pb.ModelProto()
    for t, ty, s in zip(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"], meta["tokenizer.ggml.scores"]):
        p = m.pieces.add()
        # the GGUF converter wrote user-defined pieces with spaces; SentencePiece matches them escaped
        p.piece, p.score, p.type = (t.replace(" ", "\u2581") if ty == USER_DEFINED else t), s, ty
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.unk_id = meta["tokenizer.ggml.unknown_token_id"]
    m.trainer_spec.bos_id, m.trainer_spec.eos_id = meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]
    m.trainer_spec.pad_id = meta.get("tokenizer.ggml.padding_token_id", -1)
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = False
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    sp = spm.SentencePieceProcessor(model_proto=m.SerializeToString())
    bad = [i for i, line in enumerate(lines) if sp.encode(line) != expected[i]]
    print(f"  SentencePiece agrees on {len(lines) - len(bad)}/{len(lines)} lines" + (f"; differs on {bad}" if bad else ""))


def render_gemma3(messages, add_generation_prompt=False):
    out, first, prefix = "<bos>", 0, ""
    if messages and messages[0]["role"] == "system":
        prefix, first = messages[0]["content"] + "\n\n", 1
    for i, m in enumerate(messages[first:]):
        role = "model" if m["role"] == "assistant" else m["role"]
        out += "<start_of_turn>" + role + "\n" + (prefix if i == 0 else "") + m["content"].strip() + "<end_of_turn>\n"
    return out + ("<start_of_turn>model\n" if add_generation_prompt else "")


def render_jinja(template, messages, add_generation_prompt=False, tools=None, **extra):
    """A chat template rendered as transformers' apply_chat_template renders it (its environment
    and its tojson filter); extra holds further template variables such as enable_thinking."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise ValueError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = tojson
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                            **extra)


def main(paths):
    import tokenizers
    text = open(TEXT_PATH, encoding="utf-8", newline="").read()
    lines = text.split("\n")
    for path in paths:
        meta = read_gguf_metadata(path)
        model = meta["tokenizer.ggml.model"]
        if model == "gpt2" and meta.get("tokenizer.ggml.pre") == "qwen2":
            family, tok = "qwen", build_qwen(meta)
            render = lambda c: render_jinja(meta["tokenizer.chat_template"], c["messages"], c.get("add_generation_prompt", False))
            chat_format = "qwen2.5"
        elif model == "llama":
            family, tok = "gemma", build_gemma(meta)
            render = lambda c: render_gemma3(c["messages"], c.get("add_generation_prompt", False))
            chat_format = "gemma3"
        else:
            print(f"{path}: tokenizer {model!r} is not one of the supported families, skipped")
            continue
        print(f"{path}: {meta.get('general.architecture')} / {model}, {len(meta['tokenizer.ggml.tokens'])} tokens")
        ids_special = tok.encode(text).ids
        tok.encode_special_tokens = True
        ids_plain = tok.encode(text).ids
        line_ids = [tok.encode(line, add_special_tokens=False).ids for line in lines]
        tok.encode_special_tokens = False
        chats = []
        for c in CHATS:
            rendered = render(c)
            chats.append(dict(c, format=chat_format, rendered=rendered,
                              ids=tok.encode(rendered, add_special_tokens=False).ids))
        assert tok.decode(line_ids[0]) == lines[0]
        if family == "gemma":
            check_with_sentencepiece(meta, lines, line_ids)
        out = {
            "about": "expected ids of tokenizer-text.txt, regenerate with tests/make-tokenizer-fixtures.py",
            "gguf": os.path.basename(path),
            "gguf_sha256": sha256(path),
            "text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
            "tokenizers_version": tokenizers.__version__,
            "n_vocab": len(meta["tokenizer.ggml.tokens"]),
            "ids": ids_special,
            "ids_no_special_parsing": ids_plain,
            "lines": line_ids,
            "chats": chats,
        }
        dest = os.path.join(HERE, "fixtures", f"tokenizer-{family}-ids.json")
        with open(dest, "w", encoding="utf-8", newline="\n") as f:
            json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
        print(f"  wrote {dest}: {len(ids_special)} ids")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
