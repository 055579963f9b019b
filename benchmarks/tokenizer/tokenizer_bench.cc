// Encoding throughput of mqa::Tokenizer on real source code, one thread.
//
//   tokenizer_bench --tokenizer tokenizer.json --files list.txt [--mb 4] [--passes 3]
//
// Reads the files named in list.txt (one path a line, in order; files that are not valid UTF-8
// are skipped, as the HF side cannot read them) until --mb MB, encodes each file separately
// once to warm up and then --passes times, and prints the best pass's MB/s. The token count
// and a FNV-1a hash of all ids let run_tokenizer_bench.sh check that HF produced the same ids.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/unicode.h"

namespace {

struct Args {
  std::string tokenizer;
  std::string files;
  double mb = 4;
  int passes = 3;
};

bool ParseArgs(int argc, char** argv, Args* args) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--tokenizer") {
      args->tokenizer = value;
    } else if (flag == "--files") {
      args->files = value;
    } else if (flag == "--mb") {
      args->mb = std::atof(value);
    } else if (flag == "--passes") {
      args->passes = std::max(1, std::atoi(value));
    } else {
      return false;
    }
  }
  return !args->tokenizer.empty() && !args->files.empty();
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!ParseArgs(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: tokenizer_bench --tokenizer tokenizer.json --files list.txt [--mb 4] "
                 "[--passes 3]\n");
    return 2;
  }
  auto tokenizer = mqa::Tokenizer::FromFile(args.tokenizer);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  std::ifstream list(args.files);
  std::vector<std::string> texts;
  size_t bytes = 0;
  const auto limit = static_cast<size_t>(args.mb * 1e6);
  for (std::string path; bytes < limit && std::getline(list, path);) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    if (!in || !mqa::tok::IsValidUtf8(text)) continue;
    bytes += text.size();
    texts.push_back(std::move(text));
  }
  if (texts.empty()) {
    std::fprintf(stderr, "no readable files in %s\n", args.files.c_str());
    return 1;
  }

  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the ids' decimal strings, then ','
  size_t tokens = 0;
  for (const std::string& text : texts) {  // warm-up pass (fills the BPE cache, as HF's)
    for (int32_t id : tokenizer->Encode(text)) {
      for (char c : std::to_string(id) + ",") hash = (hash ^ static_cast<uint8_t>(c)) * 1099511628211ull;
      ++tokens;
    }
  }
  double best = 1e30;
  for (int p = 0; p < args.passes; ++p) {
    const auto start = std::chrono::steady_clock::now();
    size_t n = 0;
    for (const std::string& text : texts) n += tokenizer->Encode(text).size();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (n != tokens) std::abort();
    best = std::min(best, s);
  }
  std::printf("mqaserve: %zu files, %.2f MB, %zu tokens, ids fnv1a %016llx, best of %d: %.3f s, "
              "%.2f MB/s\n",
              texts.size(), bytes / 1e6, tokens, static_cast<unsigned long long>(hash),
              args.passes, best, bytes / 1e6 / best);
  return 0;
}
