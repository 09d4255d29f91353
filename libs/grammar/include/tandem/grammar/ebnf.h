// Grammars for structured outputs (vLLM's structured_outputs.grammar),
// written in xgrammar's EBNF (vLLM's default backend; GBNF's syntax), and
// compiled to the nodes JsonMatcher (json_matcher.h) walks a byte at a time.
//
// The language is xgrammar's `Grammar.from_ebnf(text)` with the root rule
// "root":
// - rules `name ::= body`, each name at the start of its line; names are
//   [A-Za-z_.-][A-Za-z0-9_.-]*; a rule may be used before it is defined, and
//   through recursion;
// - bodies: sequences, `|`, groups `( ... )` (`( )` is the empty text),
//   strings "..." (as UTF-8; "" is the empty text), character classes
//   `[a-z]`, `[^...]` (one character each, any Unicode character but those
//   listed for `^`), rule names, each element optionally followed by one of
//   `* + ? {n} {n,} {n,m}`;
// - escapes, in strings and classes: \' \" \? \\ \a \b \f \n \r \t \v \0 \e,
//   \x followed by any number of hex digits, \uHHHH, \UHHHHHHHH; in classes
//   also \^ \$ \. \* \+ \? \( \) \[ \] \{ \} \| \/ \-;
// - whitespace and `#` comments to the end of the line between tokens.
// Refused by name, never approximated: a grammar with no `::=` (vLLM reads
// it as Lark), a missing root, a rule defined twice or used undefined,
// lookahead assertions `(= ...)`, TagDispatch, \d \s \w in a class, an
// escape of a surrogate or past U+10FFFF, a range whose ends are reversed, an
// empty class, a rule that reaches itself before reading a character (left
// recursion: xgrammar's Earley parser takes it, this pushdown reader cannot),
// an unbounded repetition of something that may be empty and holds a rule
// (`(a)*` where a may be ""), and rules nested deeper than kMaxGrammarNesting
// (json_schema.h) at one position.
//
// A part of a body that names no rule is compiled into one automaton
// (regex.h), so that `[a-z]+ ("," [a-z]+)*` is read deterministically;
// parts with rules are nodes (kSequence, kUnion, kRepeat) whose readings
// are followed side by side, up to kMaxAlternatives at once. A document's
// rules may nest up to kMaxGrammarDepth deep (past that the bytes are
// refused as too ambiguous are: JsonMatcher::overflowed), so that a
// recursive grammar cannot exhaust the worker's stack.
#pragma once

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "tandem/grammar/json_schema.h"

namespace tandem::grammar {

// `text` compiled. INVALID_ARGUMENT naming what is refused and where (line
// and column, from 1) or which rule.
[[nodiscard]] absl::StatusOr<std::shared_ptr<const Schema>> CompileEbnfDocument(
    std::string_view text);

}  // namespace tandem::grammar
