#!/usr/bin/python3
"""vLLM's pythonic and llama4_pythonic extract_tool_calls, restated over
Python's own ast, re and json: the reference pythonic_tool_calls_test holds
tandem's parser (libs/frontend/pythonic_tool_calls.cc) to.

The steps are vLLM's (vllm/tool_parsers/pythonic_tool_parser.py and
llama4_pythonic_tool_parser.py): its TOOL_CALL_REGEX matched at the start,
ast.parse of the whole answer, a first statement that is a list of calls of
plain names, each call's keyword arguments through _get_parameter_value and
json.dumps (ensure_ascii=False for pythonic, the default True for
llama4_pythonic); any failure leaves the answer as content.

Reads a JSON list of {"text": str, "llama4": bool} from the file named by
argv[1]; writes a JSON list of {"calls": [[name, arguments], ...] or null,
"content": str or null} to stdout.
"""
import ast
import json
import re
import sys
import warnings

TOOL_CALL_REGEX = re.compile(
    r"\[([a-zA-Z]+\w*\(([a-zA-Z]+\w*=.*,\s*)*([a-zA-Z]+\w*=.*\s)?\),\s*)*"
    r"([a-zA-Z]+\w*\(([a-zA-Z]+\w*=.*,\s*)*([a-zA-Z]+\w*=.*\s*)?\)\s*)+\]",
    re.DOTALL)


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


def extract(text, llama4):
    if llama4 and text.startswith("<|python_start|>"):
        text = text[len("<|python_start|>"):].replace("<|python_end|>", "")
    if TOOL_CALL_REGEX.match(text) is None:
        return {"calls": None, "content": text}
    try:
        module = ast.parse(text)
        parsed = getattr(module.body[0], "value", None)
        if not (isinstance(parsed, ast.List) and all(isinstance(e, ast.Call) for e in parsed.elts)):
            raise ValueError("Tool output must be a list of function calls")
        calls = []
        for call in parsed.elts:
            if not isinstance(call.func, ast.Name):
                raise ValueError("Invalid tool call name")
            arguments = {}
            for keyword in call.keywords:
                arguments[keyword.arg] = parameter_value(keyword.value)
            calls.append([call.func.id, json.dumps(arguments, ensure_ascii=llama4)])
        return {"calls": calls, "content": None}
    except Exception:  # as vLLM: any failure leaves the text
        return {"calls": None, "content": text}


def main():
    warnings.simplefilter("ignore")  # invalid escapes warn, and still parse
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    json.dump([extract(c["text"], c["llama4"]) for c in cases], sys.stdout)


if __name__ == "__main__":
    main()
