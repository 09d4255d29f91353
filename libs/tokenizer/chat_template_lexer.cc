#include "chat_template_lexer.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "chat_template_ast.h"

namespace tandem::tokenizer::internal::jinja {
namespace {

// What @huggingface/jinja (and transformers' environment, with trim_blocks
// and lstrip_blocks) does to the source before lexing.
std::string Preprocess(std::string_view source) {
  std::string s(source);
  if (!s.empty() && s.back() == '\n') s.pop_back();
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    // lstrip_blocks: blanks at the start of a line before {%, {# or {-.
    if (i == 0 || s[i - 1] == '\n') {
      size_t j = i;
      while (j < s.size() && (s[j] == ' ' || s[j] == '\t')) ++j;
      if (j + 1 < s.size() && s[j] == '{' &&
          (s[j + 1] == '%' || s[j + 1] == '#' || s[j + 1] == '-')) {
        i = j;
      }
    }
    // trim_blocks: the newline after %}, #} or -}.
    if (s[i] == '}' && i > 0 && (s[i - 1] == '%' || s[i - 1] == '#' || s[i - 1] == '-') &&
        i + 1 < s.size() && s[i + 1] == '\n') {
      out += '}';
      i += 2;
      continue;
    }
    out += s[i++];
  }
  return out;
}

bool IsNameStart(char c) { return absl::ascii_isalpha(c) || c == '_'; }
bool IsNameChar(char c) { return absl::ascii_isalnum(c) || c == '_'; }

// Tokens of a tag starting at `i` (just after "{{" / "{%" and an optional
// "-"), up to its closing delimiter; `i` ends after it.
std::vector<Token> LexTag(const std::string& s, size_t& i, char close, int& line,
                          bool& strip_after) {
  std::vector<Token> tokens;
  int depth = 0;  // of { } inside the tag
  while (true) {
    while (i < s.size() && absl::ascii_isspace(s[i])) line += s[i++] == '\n';
    if (i >= s.size()) Fail(line, "unterminated tag");
    const char c = s[i];
    if (depth == 0) {
      if (c == '-' && i + 2 < s.size() && s[i + 1] == close && s[i + 2] == '}') {
        strip_after = true;
        i += 3;
        return tokens;
      }
      if (c == close && i + 1 < s.size() && s[i + 1] == '}') {
        i += 2;
        return tokens;
      }
    }
    if (IsNameStart(c)) {
      size_t j = i;
      while (j < s.size() && IsNameChar(s[j])) ++j;
      tokens.push_back({Token::kName, s.substr(i, j - i)});
      i = j;
    } else if (absl::ascii_isdigit(c)) {
      size_t j = i;
      while (j < s.size() && absl::ascii_isdigit(s[j])) ++j;
      if (j + 1 < s.size() && s[j] == '.' && absl::ascii_isdigit(s[j + 1])) {
        ++j;
        while (j < s.size() && absl::ascii_isdigit(s[j])) ++j;
        tokens.push_back({Token::kFloat, s.substr(i, j - i), 0, std::stod(s.substr(i, j - i))});
      } else {
        tokens.push_back({Token::kInt, s.substr(i, j - i), std::stoll(s.substr(i, j - i))});
      }
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string value;
      size_t j = i + 1;
      while (j < s.size() && s[j] != c) {
        if (s[j] == '\\' && j + 1 < s.size()) {
          const char e = s[++j];
          value += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        } else {
          line += s[j] == '\n';
          value += s[j];
        }
        ++j;
      }
      if (j >= s.size()) Fail(line, "unterminated string");
      tokens.push_back({Token::kString, std::move(value)});
      i = j + 1;
    } else {
      static const char* const kOps[] = {"==", "!=", "<=", ">=", "//", "**", "+", "-", "*",
                                         "/",  "%",  "~",  "<",  ">",  "|",  ".", ",", ":",
                                         "(",  ")",  "[",  "]",  "{",  "}",  "="};
      bool found = false;
      for (const char* op : kOps) {
        if (s.compare(i, std::strlen(op), op) == 0) {
          tokens.push_back({Token::kOp, op});
          i += std::strlen(op);
          depth += c == '{' ? 1 : c == '}' ? -1 : 0;
          found = true;
          break;
        }
      }
      if (!found) Fail(line, absl::StrCat("unexpected character '", std::string(1, c), "'"));
    }
  }
}

}  // namespace

std::vector<Piece> Lex(std::string_view source) {
  const std::string s = Preprocess(source);
  std::vector<Piece> pieces;
  int line = 1;
  size_t i = 0;
  while (i < s.size()) {
    size_t open = s.find('{', i);
    while (open != std::string::npos && open + 1 < s.size() && s[open + 1] != '{' &&
           s[open + 1] != '%' && s[open + 1] != '#') {
      open = s.find('{', open + 1);
    }
    if (open == std::string::npos || open + 1 >= s.size()) open = s.size();
    if (open > i) {
      pieces.push_back({Piece::kText, s.substr(i, open - i), {}, line});
      line += static_cast<int>(std::count(s.begin() + i, s.begin() + open, '\n'));
    }
    if (open >= s.size()) break;
    const char kind = s[open + 1];
    i = open + 2;
    Piece piece{kind == '{' ? Piece::kOutput : Piece::kStatement, "", {}, line};
    if (i < s.size() && s[i] == '-') {
      piece.strip_before = true;
      ++i;
    }
    if (kind == '#') {
      const size_t end = s.find("#}", i);
      if (end == std::string::npos) Fail(line, "unterminated comment");
      piece.strip_after = end > i && s[end - 1] == '-';
      line += static_cast<int>(std::count(s.begin() + i, s.begin() + end, '\n'));
      i = end + 2;
      // A comment only strips whitespace around it.
      piece.kind = Piece::kText;
    } else {
      piece.tokens = LexTag(s, i, kind == '{' ? '}' : '%', line, piece.strip_after);
    }
    pieces.push_back(std::move(piece));
  }
  // Whitespace control.
  for (size_t k = 0; k < pieces.size(); ++k) {
    if (pieces[k].strip_before && k > 0 && pieces[k - 1].kind == Piece::kText) {
      std::string& t = pieces[k - 1].text;
      t.erase(
          std::find_if(t.rbegin(), t.rend(), [](char c) { return !absl::ascii_isspace(c); }).base(),
          t.end());
    }
    if (pieces[k].strip_after && k + 1 < pieces.size() && pieces[k + 1].kind == Piece::kText) {
      std::string& t = pieces[k + 1].text;
      t.erase(t.begin(),
              std::find_if(t.begin(), t.end(), [](char c) { return !absl::ascii_isspace(c); }));
    }
  }
  return pieces;
}

}  // namespace tandem::tokenizer::internal::jinja
