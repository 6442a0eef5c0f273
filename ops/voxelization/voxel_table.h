// An open-addressing table from a key to a dense id (0, 1, ... in order of insertion), shared by
// the voxelization ops and dynamic_scatter. A key is known by a 64-bit hash and, where the hash
// is not one to one, an equality test on the row that holds it. The capacity is fixed when the
// table is made, from the number of rows it may hold (a power of two at least 1.5 times that), so a
// size read from the input never allocates more than the input's own order of memory.
#pragma once

#include <cstdint>
#include <vector>

namespace opbridge {

// A bijection of the 64-bit integers (splitmix64's finaliser): keys that differ map to hashes that
// differ, so a table over one-to-one hashes needs no equality test.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

class IdTable {
 public:
  explicit IdTable(int64_t max_rows) {
    uint64_t cap = 16;
    while (cap < static_cast<uint64_t>(max_rows) * 3 / 2) cap <<= 1;  // at most 2/3 full
    mask_ = cap - 1;
    slots_.assign(cap, Slot{0, -1, -1});
  }

  // Brings the slot a hash starts at into cache ahead of its find_or_insert: the scans that use the
  // table visit keys in input order, which is random order in memory.
  void prefetch(uint64_t h) const { __builtin_prefetch(&slots_[h & mask_]); }

  // The id of the key of hash h, or `absent` when the table does not hold it (nothing is stored).
  template <typename Same>
  int32_t find(uint64_t h, int32_t absent, Same&& same) const {
    for (uint64_t s = h & mask_;; s = (s + 1) & mask_) {
      const Slot& slot = slots_[s];
      if (slot.row < 0) return absent;
      if (slot.hash == h && same(slot.row)) return slot.id;
    }
  }

  // The id of the key of `row` (hash h), or, when it is new, the id `fresh` stored for it (the
  // caller decides ids, so a refused key can be remembered under a negative one). `same(r)` says
  // whether row r holds the same key; *inserted says whether the key was new.
  template <typename Same>
  int32_t find_or_insert(uint64_t h, int32_t row, int32_t fresh, Same&& same, bool* inserted) {
    for (uint64_t s = h & mask_;; s = (s + 1) & mask_) {
      Slot& slot = slots_[s];
      if (slot.row < 0) {
        slot = Slot{h, row, fresh};
        *inserted = true;
        return fresh;
      }
      if (slot.hash == h && same(slot.row)) {
        *inserted = false;
        return slot.id;
      }
    }
  }

 private:
  struct Slot {
    uint64_t hash;
    int32_t row;  // the first row holding the key; -1: empty
    int32_t id;
  };
  uint64_t mask_ = 0;
  std::vector<Slot> slots_;
};

}  // namespace opbridge
