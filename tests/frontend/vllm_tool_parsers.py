#!/usr/bin/python3
"""vLLM's tool parsers' extract_tool_calls, restated over Python's own ast,
re and json: the reference that pythonic_tool_calls_test and
tool_calls_test hold tandem's parsers (libs/frontend/tool_calls.cc,
pythonic_tool_calls.cc, python_json.cc) to.

The steps are vLLM's (vllm/tool_parsers/: hermes_tool_parser.py,
llama_tool_parser.py, pythonic_tool_parser.py,
llama4_pythonic_tool_parser.py); pydantic's FunctionCall.name is a str.
Any failure leaves the answer as content, as in vLLM.

Reads a JSON list of {"text": str, "parser": name} from the file named by
argv[1]; writes a JSON list of {"calls": [[name, arguments], ...] or null,
"content": str or null} to stdout.
"""
import ast
import json
import re
import sys
import warnings

PYTHONIC_REGEX = re.compile(
    r"\[([a-zA-Z]+\w*\(([a-zA-Z]+\w*=.*,\s*)*([a-zA-Z]+\w*=.*\s)?\),\s*)*"
    r"([a-zA-Z]+\w*\(([a-zA-Z]+\w*=.*,\s*)*([a-zA-Z]+\w*=.*\s*)?\)\s*)+\]",
    re.DOTALL)
HERMES_REGEX = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def call(name, arguments, ensure_ascii=False):
    if not isinstance(name, str):
        raise ValueError("FunctionCall.name must be a str")
    dumped = json.dumps(arguments, ensure_ascii=ensure_ascii)
    # A lone surrogate (from a "\ud800" escape) cannot be encoded into
    # vLLM's response, which then fails; tandem leaves such an answer as
    # content, and so does this reference.
    dumped.encode("utf-8")
    name.encode("utf-8")
    return [name, dumped]


def parameter_value(val):
    if isinstance(val, ast.Constant):
        return val.value
    if isinstance(val, ast.Dict):
        if not all(isinstance(k, ast.Constant) for k in val.keys):
            raise ValueError("Dict tool call arguments must have literal keys")
        return {k.value: parameter_value(v) for k, v in zip(val.keys, val.values)}
    if isinstance(val, ast.List):
        return [parameter_value(v) for v in val.elts]
    raise ValueError("Tool call arguments must be literals")


def pythonic(text, llama4):
    if llama4 and text.startswith("<|python_start|>"):
        text = text[len("<|python_start|>"):].replace("<|python_end|>", "")
    if PYTHONIC_REGEX.match(text) is None:
        return None, text
    try:
        module = ast.parse(text)
        parsed = getattr(module.body[0], "value", None)
        if not (isinstance(parsed, ast.List) and all(isinstance(e, ast.Call) for e in parsed.elts)):
            raise ValueError("Tool output must be a list of function calls")
        calls = []
        for c in parsed.elts:
            if not isinstance(c.func, ast.Name):
                raise ValueError("Invalid tool call name")
            arguments = {}
            for keyword in c.keywords:
                arguments[keyword.arg] = parameter_value(keyword.value)
            calls.append(call(c.func.id, arguments, ensure_ascii=llama4))
        return calls, None
    except Exception:
        return None, text


def hermes(text):
    if "<tool_call>" not in text:
        return None, text
    try:
        raw = [json.loads(m[0] if m[0] else m[1]) for m in HERMES_REGEX.findall(text)]
        calls = [call(c["name"], c["arguments"]) for c in raw]
        content = text[:text.find("<tool_call>")]
        return calls, content if content else None
    except Exception:
        return None, text


def llama3_json(text):
    if not ("<|python_tag|>" in text or "{" in text):
        return None, text
    decoder = json.JSONDecoder()
    end_index = -1
    calls = []
    for match in re.finditer(r"\{", text):
        start = match.start()
        if start <= end_index:
            continue
        try:
            obj, end = decoder.raw_decode(text[start:])
            end_index = start + end
            name = obj["name"]
            arguments = obj["arguments"] if "arguments" in obj else obj["parameters"]
            calls.append(call(name, arguments))
        except Exception:
            return None, text
    return (calls, None) if calls else (None, text)


MISTRAL_REGEX = re.compile(r"\[{.*}\]", re.DOTALL)


def mistral(text):
    """vLLM's MistralToolParser with a Hugging Face tokenizer (its pre-v11
    path). Where vLLM raises out of extract_tool_calls (and fails the
    request), and where nothing loads (vLLM's content is then the text after
    the tag alone), tandem answers the whole text as content; so does this."""
    bot = "[TOOL_CALLS]"
    if bot not in text:
        return None, text
    try:
        parts = text.split(bot)
        content, raw_tool_calls = parts[0], parts[1:]
        if len(raw_tool_calls) != 1:
            raise ValueError("Only one BOT token should have been outputted")
        stringified = raw_tool_calls[0].strip()
        try:
            tool_calls = json.loads(stringified)
        except json.JSONDecodeError:
            try:
                tool_calls = json.loads(MISTRAL_REGEX.findall(stringified)[0])
            except (IndexError, json.JSONDecodeError):
                return None, text
        else:
            tool_calls = [{"name": c["name"], "arguments": json.dumps(c["arguments"],
                                                                       ensure_ascii=False)}
                          for c in tool_calls]
        calls = []
        for c in tool_calls:  # MistralToolCall(function=FunctionCall(...))
            if not isinstance(c["name"], str) or not isinstance(c["arguments"], str):
                raise ValueError("FunctionCall's name and arguments must be str")
            c["arguments"].encode("utf-8")
            calls.append([c["name"], c["arguments"]])
        return calls, content if content else None
    except Exception:
        return None, text


def extract(text, parser):
    if parser in ("pythonic", "llama4_pythonic"):
        calls, content = pythonic(text, parser == "llama4_pythonic")
    elif parser == "hermes":
        calls, content = hermes(text)
    elif parser == "mistral":
        calls, content = mistral(text)
    else:
        calls, content = llama3_json(text)
    return {"calls": calls, "content": content}


def main():
    warnings.simplefilter("ignore")  # invalid escapes warn, and still parse
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    json.dump([extract(c["text"], c["parser"]) for c in cases], sys.stdout)


if __name__ == "__main__":
    main()
