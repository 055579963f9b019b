// The Responses API's stored responses (OpenAI's `store`, true unless a request says false): what
// GET /v1/responses/{id}, GET /v1/responses/{id}/input_items, DELETE /v1/responses/{id} and a later
// request's `previous_response_id` read. Kept in rank 0's memory only (a restart forgets them),
// bounded by a count and by bytes: once either is passed the oldest entries leave first, and an
// entry larger than the whole byte budget is not kept (Put says so).
//
// Threads: every method locks; safe from any HTTP thread. Entries are immutable once put and
// handed out as shared pointers, so a reader never holds the lock while it renders one.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace mqa {

class ResponseStore {
 public:
  struct Entry {
    nlohmann::json response;     // the Response object as the client got it
    nlohmann::json input_items;  // this request's input, as the API's message items (oldest first)
    // The conversation a follow-up (previous_response_id = this id) continues: the messages before
    // this request's input (its own previous_response_id's), this input and the answer, as chat
    // messages {role, content}. Instructions are not carried over (the API's rule).
    nlohmann::ordered_json conversation;
  };

  // max_entries 0: nothing is stored (enabled() false).
  ResponseStore(size_t max_entries, size_t max_bytes);

  bool enabled() const { return max_entries_ > 0; }
  // Keeps `entry` under `id` (a new id), evicting the oldest entries past the limits; false when
  // it is not kept (the store disabled, or the entry alone larger than max_bytes).
  bool Put(const std::string& id, Entry entry);
  // Null when `id` is unknown (never stored, evicted or deleted).
  std::shared_ptr<const Entry> Get(absl::string_view id) const;
  // False when `id` is unknown.
  bool Erase(absl::string_view id);

  size_t size() const;
  size_t bytes() const;

 private:
  struct Stored {
    std::shared_ptr<const Entry> entry;
    size_t bytes = 0;
  };

  const size_t max_entries_;
  const size_t max_bytes_;
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, Stored> entries_;
  std::deque<std::string> order_;  // ids oldest first; erased ids stay until they reach the front
  size_t bytes_ = 0;
};

}  // namespace mqa
