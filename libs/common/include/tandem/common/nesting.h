// A recursive function's depth on the stack: each call holds a Nesting over
// the same counter, which is then that call's depth. The parsers of input
// from clients (tool-call JSON and Python, chat templates) bound their
// recursion with it, so a deeply nested input is an error, not a stack
// overflow.
#pragma once

namespace tandem {

class Nesting {
 public:
  explicit Nesting(int& depth) : depth_(++depth) {}
  ~Nesting() { --depth_; }
  Nesting(const Nesting&) = delete;
  Nesting& operator=(const Nesting&) = delete;

 private:
  int& depth_;
};

}  // namespace tandem
