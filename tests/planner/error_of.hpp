// The message of the dlplan::Error a call throws: a test failure when it
// throws nothing, or anything but a dlplan::Error (which the CLI would report
// as an internal error, exit 3). Shared by the planner's bad-input tests.
#pragma once

#include "dlplan/error.hpp"

#include <gtest/gtest.h>

#include <exception>
#include <string>

namespace dlplan::testing {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-dlplan exception (the CLI's internal error): " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

}  // namespace dlplan::testing
