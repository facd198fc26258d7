#include "common/host_port.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace drafthead {

absl::Status SplitHostPort(const std::string& hostport, std::string* host, int* port) {
  std::string h, p;
  if (!hostport.empty() && hostport[0] == '[') {
    const size_t close = hostport.find(']');
    if (close == std::string::npos || close + 1 >= hostport.size() || hostport[close + 1] != ':')
      return absl::InvalidArgumentError(absl::StrCat("bad address '", hostport, "': want [v6]:port"));
    h = hostport.substr(1, close - 1);
    p = hostport.substr(close + 2);
  } else {
    const size_t colon = hostport.rfind(':');
    if (colon == std::string::npos)
      return absl::InvalidArgumentError(absl::StrCat("bad address '", hostport, "': want HOST:PORT"));
    h = hostport.substr(0, colon);
    p = hostport.substr(colon + 1);
  }
  int v;
  if (!absl::SimpleAtoi(p, &v) || v < 0 || v > 65535)
    return absl::InvalidArgumentError(absl::StrCat("bad port in '", hostport, "'"));
  *host = h.empty() ? "0.0.0.0" : h;
  *port = v;
  return absl::OkStatus();
}

}  // namespace drafthead
