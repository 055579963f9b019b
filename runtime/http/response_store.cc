#include "runtime/http/response_store.h"

#include <utility>

namespace mqa {

ResponseStore::ResponseStore(size_t max_entries, size_t max_bytes)
    : max_entries_(max_entries), max_bytes_(max_bytes) {}

bool ResponseStore::Put(const std::string& id, Entry entry) {
  if (!enabled()) return false;
  // What the entry holds, as its JSON text: a fair measure of its memory, counted once here.
  const size_t bytes = id.size() + entry.response.dump().size() + entry.input_items.dump().size() +
                       entry.conversation.dump().size();
  if (bytes > max_bytes_) return false;
  auto shared = std::make_shared<const Entry>(std::move(entry));
  std::lock_guard<std::mutex> lock(mu_);
  while (!order_.empty() && (entries_.size() >= max_entries_ || bytes_ + bytes > max_bytes_)) {
    auto oldest = entries_.find(order_.front());
    if (oldest != entries_.end()) {
      bytes_ -= oldest->second.bytes;
      entries_.erase(oldest);
    }
    order_.pop_front();
  }
  if (!entries_.emplace(id, Stored{std::move(shared), bytes}).second) return false;
  order_.push_back(id);
  bytes_ += bytes;
  return true;
}

std::shared_ptr<const ResponseStore::Entry> ResponseStore::Get(absl::string_view id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.entry;
}

bool ResponseStore::Erase(absl::string_view id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  bytes_ -= it->second.bytes;
  entries_.erase(it);
  // Its id leaves order_ when it reaches the front (every eviction pops one id, found or not);
  // compact when erased ids make up most of it, so deletes cannot grow it without bound.
  if (order_.size() > 2 * entries_.size() + 64) {
    std::deque<std::string> live;
    for (std::string& kept : order_) {
      if (entries_.contains(kept)) live.push_back(std::move(kept));
    }
    order_ = std::move(live);
  }
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

size_t ResponseStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace mqa
