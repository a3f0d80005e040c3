#include "tools/local_pool.hpp"

#include <string>

#include "ipc/diag/shm_check.hpp"
#include "ipc/log.hpp"
#include "tools/ferry_inputs.hpp"

namespace ferry::tools {

void check_shared_memory(unsigned workers) {
  ferry::ShmCheckOptions options;
  options.workers = workers;
  const ferry::ShmReport report = ferry::check_shm(options);
  std::string failures;
  std::optional<ferry::Errc> code;  // the first failed check's, in the report's order
  for (const auto& item : report.items) {
    if (item.verdict == ferry::Verdict::ok) continue;
    const std::string line =
        item.name + ": " + item.summary + (item.remedy.empty() ? "" : "; " + item.remedy);
    if (item.verdict == ferry::Verdict::fail) {
      failures += "\n  " + line;
      if (!code) code = ferry::failure_code(item.name);
    } else {
      ferry::log().info("shared-memory check: {}", line);
    }
  }
  if (code) {
    throw ferry::Error(*code,
                       "the shared-memory checks failed (ferry-shm check tells more):" + failures);
  }
}

void start_pool(std::optional<ferry::Pool>& pool, const ferry::PoolOptions& o) {
  try {
    pool.emplace(o);
  } catch (const ferry::Error& e) {
    if (e.code() == ferry::Errc::invalid_argument) throw BadInput(e.detail());
    throw;
  }
}

}  // namespace ferry::tools
