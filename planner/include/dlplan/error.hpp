// The one error type a user can cause. Its message names the file, node,
// field or rank that is wrong; main() prints it and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>

namespace dlplan {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace dlplan
