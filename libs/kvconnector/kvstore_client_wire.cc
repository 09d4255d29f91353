#include "kvstore_client_wire.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "tandem/kvtypes/checksum.h"

namespace tandem::kvconnector::wire {
namespace {

constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kStartGroup = 3, kEndGroup = 4,
                   kFixed32 = 5;
// Nesting limit of unknown groups (the generated parser's recursion limit).
constexpr int kMaxGroupDepth = 100;

// A read position in the message's segments; `at` counts bytes from the
// message's start (for error messages and bounds).
class Cursor {
 public:
  Cursor(Segments segs, uint64_t size) : segs_(segs), size_(size) { SkipEmpty(); }

  [[nodiscard]] uint64_t at() const { return at_; }
  [[nodiscard]] PayloadRef Here(uint64_t n) const { return {seg_, pos_, n}; }

  bool ReadByte(uint8_t* b) {
    if (at_ >= size_) return false;
    *b = segs_[seg_][pos_];
    Advance(1);
    return true;
  }

  // Reads a varint of at most 10 bytes.
  absl::Status ReadVarint(uint64_t* v, const char* what) {
    const uint64_t start = at_;
    uint64_t out = 0;
    for (int i = 0; i < 10; ++i) {
      uint8_t b;
      if (!ReadByte(&b)) return Error(start, absl::StrCat("truncated varint (", what, ")"));
      out |= static_cast<uint64_t>(b & 0x7F) << (7 * i);
      if ((b & 0x80) == 0) {
        *v = out;
        return absl::OkStatus();
      }
    }
    return Error(start, absl::StrCat("varint longer than 10 bytes (", what, ")"));
  }

  // Skips n bytes that must lie before `end`.
  absl::Status Skip(uint64_t n, uint64_t end, const char* what) {
    if (at_ > end || n > end - at_) {
      return Error(at_, absl::StrCat(what, " of ", n, " bytes overruns its enclosing message (",
                                     at_ > end ? 0 : end - at_, " bytes left)"));
    }
    Advance(n);
    return absl::OkStatus();
  }

  static absl::Status Error(uint64_t at, absl::string_view what) {
    return absl::InternalError(absl::StrCat("malformed LoadResponse at byte ", at, ": ", what));
  }

 private:
  void Advance(uint64_t n) {
    at_ += n;
    while (n > 0) {
      const size_t left = segs_[seg_].size() - pos_;
      if (n < left) {
        pos_ += n;
        return;
      }
      n -= left;
      ++seg_;
      pos_ = 0;
      SkipEmpty();
    }
    SkipEmpty();
  }
  void SkipEmpty() {
    while (seg_ < segs_.size() && pos_ >= segs_[seg_].size()) {
      ++seg_;
      pos_ = 0;
    }
  }

  Segments segs_;
  uint64_t size_;
  size_t seg_ = 0;
  size_t pos_ = 0;
  uint64_t at_ = 0;
};

absl::Status ReadTag(Cursor* c, uint32_t* field, uint32_t* type) {
  const uint64_t start = c->at();
  uint64_t tag;
  if (absl::Status s = c->ReadVarint(&tag, "field tag"); !s.ok()) return s;
  if (tag > 0xFFFFFFFFu || (tag >> 3) == 0) {
    return Cursor::Error(start, absl::StrCat("invalid field tag ", tag));
  }
  *field = static_cast<uint32_t>(tag >> 3);
  *type = static_cast<uint32_t>(tag & 7);
  if (*type > kFixed32) {
    return Cursor::Error(start, absl::StrCat("field ", *field, " has invalid wire type ", *type));
  }
  return absl::OkStatus();
}

// Skips the value of an unknown field whose tag (at byte `tag_at`) was just
// read.
absl::Status SkipField(Cursor* c, uint64_t tag_at, uint32_t field, uint32_t type, uint64_t end,
                       int depth) {
  const uint64_t start = tag_at;
  switch (type) {
    case kVarint: {
      uint64_t v;
      return c->ReadVarint(&v, "unknown varint field");
    }
    case kFixed64:
      return c->Skip(8, end, "fixed64 field");
    case kFixed32:
      return c->Skip(4, end, "fixed32 field");
    case kLengthDelimited: {
      uint64_t n;
      if (absl::Status s = c->ReadVarint(&n, "field length"); !s.ok()) return s;
      return c->Skip(n, end, "length-delimited field");
    }
    case kStartGroup: {
      if (depth >= kMaxGroupDepth) return Cursor::Error(start, "groups nested too deeply");
      for (;;) {
        if (c->at() >= end) {
          return Cursor::Error(start, absl::StrCat("group ", field, " has no end"));
        }
        const uint64_t at = c->at();
        uint32_t f, t;
        if (absl::Status s = ReadTag(c, &f, &t); !s.ok()) return s;
        if (t == kEndGroup) {
          if (f != field) {
            return Cursor::Error(at, absl::StrCat("group ", field, " ended by end tag ", f));
          }
          return absl::OkStatus();
        }
        if (absl::Status s = SkipField(c, at, f, t, end, depth + 1); !s.ok()) return s;
      }
    }
    case kEndGroup:
      return Cursor::Error(start, absl::StrCat("end-group tag ", field, " without a group"));
    default:  // ReadTag rejected the others
      return Cursor::Error(start, absl::StrCat("field ", field, " has invalid wire type ", type));
  }
}

// Parses a LoadChunk's fields from the cursor up to `end`.
absl::Status ParseChunk(Cursor* c, uint64_t end, LoadChunkView* out) {
  while (c->at() < end) {
    const uint64_t tag_at = c->at();
    uint32_t field, type;
    if (absl::Status s = ReadTag(c, &field, &type); !s.ok()) return s;
    const bool is_varint = type == kVarint;
    if (field == 3 && type == kLengthDelimited) {
      uint64_t n;
      if (absl::Status s = c->ReadVarint(&n, "LoadChunk.data length"); !s.ok()) return s;
      const PayloadRef here = c->Here(n);
      if (absl::Status s = c->Skip(n, end, "LoadChunk.data"); !s.ok()) return s;
      out->data = here;
      continue;
    }
    if (is_varint && field >= 1 && field <= 8 && field != 3) {
      uint64_t v;
      if (absl::Status s = c->ReadVarint(&v, "LoadChunk field"); !s.ok()) return s;
      switch (field) {
        case 1:
          out->block_index = static_cast<int32_t>(v);
          break;
        case 2:
          out->offset = v;
          break;
        case 4:
          out->last = v != 0;
          break;
        case 5:
          out->ok = v != 0;
          break;
        case 6:
          out->miss_reason = static_cast<int32_t>(v);
          break;
        case 7:
          out->total_size = v;
          break;
        case 8:
          out->checksum = static_cast<uint32_t>(v);
          break;
      }
      continue;
    }
    // Unknown field (or a known number with another wire type, which the
    // generated parser also keeps as unknown).
    if (absl::Status s = SkipField(c, tag_at, field, type, end, 0); !s.ok()) return s;
  }
  if (c->at() != end) return Cursor::Error(c->at(), "LoadChunk overruns its length");
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseLoadResponse(Segments message, std::vector<LoadChunkView>* chunks) {
  chunks->clear();
  uint64_t size = 0;
  for (const auto& s : message) size += s.size();
  Cursor c(message, size);
  while (c.at() < size) {
    const uint64_t tag_at = c.at();
    uint32_t field, type;
    if (absl::Status s = ReadTag(&c, &field, &type); !s.ok()) return s;
    if (field == 1 && type == kLengthDelimited) {
      const uint64_t start = c.at();
      uint64_t n;
      if (absl::Status s = c.ReadVarint(&n, "LoadChunk length"); !s.ok()) return s;
      if (n > size - c.at()) {
        return Cursor::Error(
            start, absl::StrCat("LoadChunk of ", n, " bytes overruns the message (", size - c.at(),
                                " bytes left)"));
      }
      LoadChunkView& chunk = chunks->emplace_back();
      if (absl::Status s = ParseChunk(&c, c.at() + n, &chunk); !s.ok()) return s;
      continue;
    }
    if (absl::Status s = SkipField(&c, tag_at, field, type, size, 0); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void CopyLoadPayload(Segments message, const PayloadRef& data, uint8_t* dst, uint32_t* crc) {
  constexpr size_t kPiece = 64 << 10;
  size_t seg = data.segment;
  size_t pos = data.pos;
  uint64_t left = data.size;
  while (left > 0) {
    const std::span<const uint8_t> s = message[seg];
    const size_t n = static_cast<size_t>(std::min<uint64_t>({left, s.size() - pos, kPiece}));
    *crc = kvstore::Crc32cCopy(*crc, dst, s.data() + pos, n);
    dst += n;
    left -= n;
    pos += n;
    if (pos == s.size()) {
      ++seg;
      pos = 0;
    }
  }
}

}  // namespace tandem::kvconnector::wire
