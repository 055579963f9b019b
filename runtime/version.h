// mqaserve's version, as /version (vLLM's), TGI's /info and llama.cpp's /props report it.
#pragma once

namespace mqa {

inline constexpr char kMqaserveVersion[] = "0.1.0";

}  // namespace mqa
