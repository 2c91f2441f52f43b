#!/usr/bin/env python3
"""Regenerates tests/fixtures/chat-tools.json: tool-calling conversations rendered with the real
Qwen2.5-Instruct and Qwen3 chat templates (the chat_template of their tokenizer_config.json), the
way transformers' apply_chat_template(messages, tools=tools) renders them (render_jinja of
tests/make-tokenizer-fixtures.py: jinja2's ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, and transformers' tojson filter). test-tokenizer checks that
chat_tokenize gives exactly the rendered text of every case, and trains on exactly its
"trained" text.

The templates are stored in the fixture too, so that it can be regenerated without them.
Checked against transformers itself (5.24, 2026-12-02): AutoTokenizer of tests/fixtures/tiny-qwen2
with each stored template, apply_chat_template(messages, tools=tools, tokenize=False, ...) gives
every case's rendered text exactly.

Usage: pip install jinja2
       python3 tests/make-chat-tool-fixtures.py QWEN2.5_TEMPLATE.jinja QWEN3_TEMPLATE.jinja
       python3 tests/make-chat-tool-fixtures.py      # with the templates stored in the fixture
"""
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("make_tokenizer_fixtures", os.path.join(HERE, "make-tokenizer-fixtures.py"))
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)
render_jinja = _fixtures.render_jinja

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": 1}},
        "required": ["city"], "additionalProperties": False}}}
CALC = {"type": "function", "function": {
    "name": "calculate", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {
        "expression": {"type": "string"},
        "tolerance": {"type": "number", "default": 0.0001, "maximum": 1e16, "minimum": 1e-05},
        "scale": {"type": "number", "default": 2.0}},
        "required": ["expression"]}}}
# descriptions and arguments with non-ASCII text, JSON escapes and numbers Python writes its own way
ODD = {"type": "function", "function": {
    "name": "traduire", "description": "Traduit «le texte» — 翻译文本 😀\n\t\"quoted\" back\\slash / slash \x01 ctrl \x7f del",
    "parameters": {"type": "object", "properties": {"texte": {"type": "string", "description": "é, ß, ñ, 中文"}}}}}

USER = {"role": "user", "content": "What's the weather in Paris for 3 days?"}
CALL_OBJECT = {"type": "function", "function": {"name": "get_weather", "arguments": {
    "city": "Paris", "days": 3, "unit": "celsius", "threshold": 21.5,
    "options": {"hourly": True, "alerts": None, "layers": [1, 2.0, "rain", {"depth": -0.25}], "tags": []}}}}
CALL_RESULT = {"role": "tool", "name": "get_weather", "content": '{"temperature": 18.5, "condition": "cloudy"}'}
ANSWER = {"role": "assistant", "content": "It is 18.5 °C and cloudy in Paris."}


def case(name, fmt, messages, tools=None, **extra):
    return dict(name=name, format=fmt, messages=messages, tools=tools, **extra)


CASES = [
    # (a) Qwen2.5: tools without a system message (the default system prompt), an OpenAI-form call
    # with object arguments (nested values, a float, an int), its response, the answer
    case("qwen2.5 tools, default system", "qwen2.5",
         [USER, {"role": "assistant", "content": "", "tool_calls": [CALL_OBJECT]}, CALL_RESULT, ANSWER],
         [WEATHER, CALC]),
    # (b) the same with a system message (content null in the calling message)
    case("qwen2.5 tools and system", "qwen2.5",
         [{"role": "system", "content": "You are a weather bot."}, USER,
          {"role": "assistant", "content": None, "tool_calls": [CALL_OBJECT]}, CALL_RESULT, ANSWER],
         [WEATHER]),
    # (c) content and two calls whose arguments are JSON strings (OpenAI's form): tojson quotes them
    case("qwen2.5 content and two string-argument calls", "qwen2.5",
         [{"role": "user", "content": "Paris or Tokyo: which is warmer?"},
          {"role": "assistant", "content": "Let me check both cities.", "tool_calls": [
              {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
              {"id": "call_2", "type": "function",
               "function": {"name": "get_weather", "arguments": '{"city": "Tokyo", "unit": "fahrenheit"}'}}]},
          {"role": "tool", "tool_call_id": "call_1", "content": "18.5"},
          {"role": "tool", "tool_call_id": "call_2", "content": "75"},
          {"role": "assistant", "content": "Tokyo is warmer."}],
         [WEATHER]),
    # (d) calls without the "function" wrapper, two tool messages in a row: one user turn
    case("qwen2.5 consecutive tool messages", "qwen2.5",
         [{"role": "user", "content": "Compute 2+2 and 3*3."},
          {"role": "assistant", "content": "", "tool_calls": [
              {"name": "calculate", "arguments": {"expression": "2+2"}},
              {"name": "calculate", "arguments": {"expression": "3*3", "tolerance": 0.5}}]},
          {"role": "tool", "content": "4"}, {"role": "tool", "content": "9"},
          {"role": "assistant", "content": "2+2 is 4 and 3*3 is 9."}],
         [CALC]),
    # (e) Qwen3: tools and system, a call with object arguments and one with string arguments (as
    # is), two tool messages, reasoning_content on the final answer
    case("qwen3 tools, system, reasoning", "qwen3",
         [{"role": "system", "content": "You are a weather bot."},
          {"role": "user", "content": "Paris or Tokyo: which is warmer?"},
          {"role": "assistant", "content": "", "tool_calls": [
              CALL_OBJECT,
              {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Tokyo", "unit": "fahrenheit"}'}}]},
          {"role": "tool", "content": '{"temperature": 18.5}'}, {"role": "tool", "content": '{"temperature": 75}'},
          {"role": "assistant", "content": "Tokyo is warmer.", "reasoning_content": "75 °F is about 24 °C, above 18.5 °C."}],
         [WEATHER, CALC]),
    # (e') Qwen3, several steps: a call with reasoning and content after the last query (its think
    # block is rendered and trained), then a call with neither, then the answer
    case("qwen3 multi-step calls", "qwen3",
         [{"role": "user", "content": "Compute (2+2)*3."},
          {"role": "assistant", "content": "First the sum.", "reasoning_content": "Two steps.",
           "tool_calls": [{"name": "calculate", "arguments": {"expression": "2+2"}}]},
          {"role": "tool", "content": "4"},
          {"role": "assistant", "content": "", "tool_calls": [{"name": "calculate", "arguments": {"expression": "4*3"}}]},
          {"role": "tool", "content": "12"},
          {"role": "assistant", "content": "(2+2)*3 = 12."}],
         [CALC]),
    # (f) Qwen3 without tools but with a call: no tools block, the call rendered all the same
    case("qwen3 call without tools", "qwen3",
         [USER, {"role": "assistant", "content": "Checking.", "tool_calls": [CALL_OBJECT]}, CALL_RESULT, ANSWER]),
    # (g) the generation prompt after a tool response
    case("qwen2.5 generation prompt after a tool response", "qwen2.5",
         [USER, {"role": "assistant", "content": "", "tool_calls": [CALL_OBJECT]}, CALL_RESULT],
         [WEATHER], add_generation_prompt=True),
    case("qwen3 generation prompt after a tool response", "qwen3",
         [USER, {"role": "assistant", "content": "", "tool_calls": [CALL_OBJECT]}, CALL_RESULT],
         [WEATHER], add_generation_prompt=True),
    case("qwen3 generation prompt, thinking off", "qwen3",
         [USER, {"role": "assistant", "content": "", "tool_calls": [CALL_OBJECT]}, CALL_RESULT],
         [WEATHER], add_generation_prompt=True, enable_thinking=False),
    # (h) non-ASCII text, escapes and Python's number forms in tools and arguments
    case("qwen2.5 non-ASCII and escapes", "qwen2.5",
         [{"role": "user", "content": "Traduis « bonjour » en 中文."},
          {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "traduire", "arguments": {
              "texte": "São Paulo — «olá» 😀", "note": "line1\nline2\t\"q\" \\ / \x01\x1f\x7f",
              "big": 123456789012345678901234567890, "neg": -17, "small": 1e-07, "huge": 1.5e+300, "round": 1e16,
              "fixed": 1234567890123456.0, "tiny": 0.0001}}}]},
          {"role": "tool", "content": "你好"}, {"role": "assistant", "content": "« bonjour » se dit 你好."}],
         [ODD]),
    case("qwen3 non-ASCII and escapes", "qwen3",
         [{"role": "user", "content": "Traduis « bonjour » en 中文."},
          {"role": "assistant", "content": "", "tool_calls": [
              {"type": "function", "function": {"name": "traduire", "arguments": '{"texte": "São Paulo — «olá» 😀\\n"}'}},
              {"type": "function", "function": {"name": "traduire", "arguments": {"texte": "tab\there \"q\" \\ ☃"}}}]},
          {"role": "tool", "content": "你好"}, {"role": "assistant", "content": "« bonjour » se dit 你好."}],
         [ODD]),
]


def trained_text(rendered):
    """What the loss trains on: every finished assistant turn after its "<|im_start|>assistant\\n"
    header, up to and including its <|im_end|>, less an empty think block (prompt: it is what
    enable_thinking=False feeds)."""
    out = ""
    for turn in rendered.split("<|im_start|>")[1:]:
        if turn.startswith("assistant\n") and "<|im_end|>" in turn:
            body = turn[len("assistant\n"):turn.index("<|im_end|>") + len("<|im_end|>")]
            out += body[len("<think>\n\n</think>\n\n"):] if body.startswith("<think>\n\n</think>\n\n") else body
    return out


DEST = os.path.join(HERE, "fixtures", "chat-tools.json")


def main(paths):
    if paths:
        templates = {}
        for fmt, path in zip(("qwen2.5", "qwen3"), paths):
            with open(path, encoding="utf-8") as f:
                templates[fmt] = f.read()
    else:
        with open(DEST, encoding="utf-8") as f:
            templates = json.load(f)["templates"]
    cases = []
    for c in CASES:
        extra = {k: v for k, v in c.items() if k == "enable_thinking"}
        rendered = render_jinja(templates[c["format"]], c["messages"], c.get("add_generation_prompt", False),
                                tools=c["tools"], **extra)
        cases.append(dict(c, add_generation_prompt=c.get("add_generation_prompt", False), rendered=rendered,
                          trained=trained_text(rendered)))
    out = {
        "note": "Qwen2.5-Instruct and Qwen3 chat templates (tokenizer_config.json chat_template), rendered as "
                "transformers' apply_chat_template(messages, tools=tools) does; regenerate with "
                "tests/make-chat-tool-fixtures.py",
        "templates": templates,
        "cases": cases,
    }
    with open(DEST, "w", encoding="utf-8", newline="\n") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {DEST}: {len(cases)} cases")


if __name__ == "__main__":
    if len(sys.argv) not in (1, 3):
        sys.exit(__doc__)
    main(sys.argv[1:])
