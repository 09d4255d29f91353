// RocksDB is not built with ThreadSanitizer, so TSan cannot see its lock-free
// memtable synchronization and reports races inside it. Our own code is still
// checked: a report is suppressed only when a RocksDB frame is on its stack.
extern "C" const char* __tsan_default_suppressions() {
  return "race:rocksdb::\n"
         "race:librocksdb.so\n";
}
