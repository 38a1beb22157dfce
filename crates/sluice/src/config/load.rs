//! Loading a configuration, stage by stage, the same for every source (files, xDS):
//! discovery, which files are config files (`load/discover.rs`); validation of each document
//! against upstream's schema and messages (`load/validate.rs`, with a `rate_limit` and its
//! algorithm in `load/rate_limit.rs`), reading plain scalars as YAML 1.1 does
//! (`load/scalars.rs`); compilation into each domain's lookup tree (`load/compile.rs`).
//!
//! Every error names the file and, for a file's text, the line; loading goes on after an error
//! so that one run reports every problem, and fails if there was any.

mod calendar;
mod compile;
mod discover;
mod rate_limit;
mod scalars;
mod validate;

use std::fs;
use std::path::{Path, PathBuf};

use super::yaml::Node;
use super::{ConfigError, ConfigErrors, RateLimitConfig};

/// Loader switches that come from the environment (upstream's variable names in brackets).
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Several files may add descriptors to one domain (`MERGE_DOMAIN_CONFIG`).
    pub merge_domains: bool,
    /// Skip files and directories whose name starts with a dot (`RUNTIME_IGNOREDOTFILES`).
    pub ignore_dotfiles: bool,
}

/// Loads every regular file under `dir` (recursively, in path order), whatever its name ends
/// with, as upstream's runtime loader does: `limits.yml` and `limits` are config files too.
///
/// Names starting with `..` are Kubernetes' ConfigMap internals (`..data`, `..2024_…`): the same
/// files are visible through the top-level links, so they are always skipped. Other dot-files
/// are loaded unless [`LoadOptions::ignore_dotfiles`]. A directory that yields no domain loads,
/// with a warning, since upstream's service starts on it too.
pub fn load_dir(dir: &Path, options: &LoadOptions) -> Result<RateLimitConfig, ConfigErrors> {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    discover::collect_files(dir, options, &mut files, &mut errors);
    files.sort();
    let mut sources = Vec::with_capacity(files.len());
    for file in &files {
        match fs::read_to_string(file) {
            Ok(text) => sources.push((file.clone(), text)),
            Err(e) => errors.push(ConfigError {
                file: file.clone(),
                line: None,
                reason: format!("cannot read file: {e}"),
            }),
        }
    }
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    let mut config = load_sources(sources, options)?;
    if config.domains.is_empty() {
        config.warnings.push(ConfigError {
            file: dir.to_path_buf(),
            line: None,
            reason: format!(
                "no domain loaded from {} file(s): every request will be answered OK \
                 with no limit",
                files.len()
            ),
        });
    }
    config.files = files;
    Ok(config)
}

/// Validates and compiles config files given as `(path, contents)`.
pub fn load_sources(
    sources: Vec<(PathBuf, String)>,
    options: &LoadOptions,
) -> Result<RateLimitConfig, ConfigErrors> {
    let documents = sources
        .into_iter()
        .map(|(path, text)| (path, Document::Text(text)))
        .collect();
    load_documents(documents, options)
}

/// One config document on its way to the validator: a file's text, or a tree built from
/// something else (an xDS resource), checked by the same rules.
pub(super) enum Document {
    Text(String),
    /// Built, not written: its nodes carry no meaningful line, so errors name the source only.
    Tree(Node),
}

/// Validates and compiles documents, each named by its source (a file path or a resource name).
/// Every source of configuration goes through here, so files and xDS share one validator.
pub(super) fn load_documents(
    documents: Vec<(PathBuf, Document)>,
    options: &LoadOptions,
) -> Result<RateLimitConfig, ConfigErrors> {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let domains = validate::documents(documents, options, &mut errors, &mut warnings);
    let mut config = compile::domains(domains, &mut errors);
    compile::number_limits(&mut config);
    if errors.is_empty() {
        config.warnings = warnings;
        Ok(config)
    } else {
        Err(ConfigErrors(errors))
    }
}
