// Numbers with units, as every output prints them: bytes in GiB / MiB / KiB,
// times in ms (or s / µs), FLOP/s in TFLOP/s.
#pragma once

#include <cstdint>
#include <string>

namespace dlplan {

std::string format_bytes(double bytes);     // "23.41 GiB", "512.0 MiB", "12.0 KiB", "0 B"
std::string format_seconds(double seconds); // "312.4 ms", "1.25 s", "15.7 µs"

}  // namespace dlplan

namespace dlplan {
std::string format_count(int64_t n);        // "86,567,656"
}  // namespace dlplan
