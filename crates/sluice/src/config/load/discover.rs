//! Discovery: which files under the config directory are config files. Upstream's runtime
//! loader takes every regular file, whatever its name, so this does too; the only files left
//! out are Kubernetes' ConfigMap internals and, when asked, dot-files.

use std::fs;
use std::path::{Path, PathBuf};

use super::LoadOptions;
use crate::config::ConfigError;

/// Adds every config file under `dir` (following symlinks, recursing into directories) to
/// `files`, and to `errors` every entry that cannot be read.
pub(super) fn collect_files(
    dir: &Path,
    options: &LoadOptions,
    files: &mut Vec<PathBuf>,
    errors: &mut Vec<ConfigError>,
) {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            errors.push(ConfigError {
                file: dir.to_path_buf(),
                line: None,
                reason: format!("cannot read config directory: {e}"),
            });
            return;
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("..") || (options.ignore_dotfiles && name.starts_with('.')) {
            continue;
        }
        let path = entry.path();
        // `metadata` follows symlinks, as ConfigMap mounts need.
        match fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => collect_files(&path, options, files, errors),
            Ok(meta) if meta.is_file() => files.push(path),
            // Sockets, pipes, devices: not files anyone writes limits into.
            Ok(_) => {}
            Err(e) => errors.push(ConfigError {
                file: path,
                line: None,
                reason: format!("cannot read file: {e}"),
            }),
        }
    }
}
