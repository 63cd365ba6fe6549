// Writing an output file (--out, --report, --timeline): a regular file (or a
// new one) is replaced atomically, through PATH.tmp and a rename, so a
// failure never leaves half a file or destroys the previous one; a character
// device or a pipe (/dev/null, /dev/stdout, a FIFO) is written through, never
// replaced; a folder, a block device or a socket is refused. A symbolic link
// is followed: its target is written, the link stays.
#pragma once

#include <string>
#include <string_view>

namespace dlplan {

// Throws dlplan::Error naming `path`.
void write_output_file(const std::string& path, std::string_view text);

}  // namespace dlplan
