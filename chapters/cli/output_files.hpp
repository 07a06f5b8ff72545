// output_files.hpp: the one rule for the files a subcommand writes (--save, --log,
// --calibration), checked before any work, so that a run that will train for an hour does
// not learn at its end that it cannot keep its result, and never writes over what it
// should not:
//   - a path names a regular file, or nothing yet: not a folder, a device, a pipe or a
//     socket; a link is followed, and the write lands on the file it names (the link stays);
//   - its folder exists and takes a new file (every write goes to PATH.tmp, then a rename);
//   - no two outputs name the same file, and no output names a file the run reads
//     (--data, --test-data, --init).
// A path that breaks the rule is refused with UsageError (exit code 2), naming its flag.
#pragma once

#include <string>
#include <vector>

#include "chapters/cli/options.hpp"

namespace bigbatch::cli {

/// A file the command line names, with the flag that named it.
struct NamedFile {
  std::string flag;  ///< "--save"
  std::string path;  ///< as given
};

/// Checks `outputs` against the rule above and against `inputs`. Returns each output's
/// write target, in order: its path, or for a link the file the link names, followed to
/// the end.
std::vector<std::string> check_output_files(const std::vector<NamedFile>& outputs,
                                            const std::vector<NamedFile>& inputs);

/// The files a --data or --test-data source reads (none for a data set by name).
std::vector<std::string> files_of(const DataSource& source);

}  // namespace bigbatch::cli
