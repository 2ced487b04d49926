//! The Redis Function library: the same Lua as the `EVALSHA` scripts, loaded once per node
//! with `FUNCTION LOAD` and called with `FCALL`, so the definitions run once rather than on
//! every call.
//!
//! Its name is `turnstile_<N>_<hash>`: `N` the release (see [`RELEASE`]), `hash` the first
//! 12 hex digits of the SHA-256 of its body, so two builds with different Lua never share a
//! name. Function names are global across a server's libraries, so its functions carry the
//! library's name too: `<library>_check`, `<library>_batch`, `<library>_config`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use sha2::{Digest, Sha256};

use crate::call::{Call, Which};
use crate::fault::{classify, is_function_not_found as is_not_found, Fault};
use crate::server::Query;
use crate::wire::{BATCH_SCRIPT, CHECK_SCRIPT, CONFIG_SCRIPT, LIBRARY_BODY};

/// Every library name begins with this.
pub(crate) const LIBRARY_PREFIX: &str = "turnstile_";

/// This release as one number, `major · 10^6 + minor · 10^3 + patch` of the crate's version
/// (0.1.0 is 1000): later releases have larger numbers, so a release can tell the libraries
/// of older ones (smaller `N`), which it deletes, from those of newer ones, which it keeps.
pub(crate) const RELEASE: u64 = release(
    env!("CARGO_PKG_VERSION_MAJOR"),
    env!("CARGO_PKG_VERSION_MINOR"),
    env!("CARGO_PKG_VERSION_PATCH"),
);

const fn digits(s: &str) -> u64 {
    let b = s.as_bytes();
    let mut i = 0;
    let mut n = 0;
    while i < b.len() {
        assert!(b[i].is_ascii_digit(), "a version part is not a number");
        n = n * 10 + (b[i] - b'0') as u64;
        i += 1;
    }
    n
}

const fn release(major: &str, minor: &str, patch: &str) -> u64 {
    let (major, minor, patch) = (digits(major), digits(minor), digits(patch));
    assert!(
        minor < 1000 && patch < 1000,
        "minor and patch must stay below 1000"
    );
    major * 1_000_000 + minor * 1_000 + patch
}

/// The Redis Function library this build loads (see [`library`]).
#[derive(Debug)]
pub struct FunctionLibrary {
    name: String,
    check: String,
    batch: String,
    config: String,
    source: String,
}

impl FunctionLibrary {
    /// The library's name, `turnstile_<N>_<hash>`: `N` this release as one number
    /// (`major · 10^6 + minor · 10^3 + patch` of the crate's version; 0.1.0 is 1000), `hash`
    /// the first 12 hex digits of the SHA-256 of the library's Lua, so builds with different
    /// Lua never share a name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The function checks, refunds and resets call (`<library>_check`), with the check
    /// script's keys and arguments (see `lua/check.lua`).
    pub fn check_function(&self) -> &str {
        &self.check
    }

    /// The function batches of checks call (`<library>_batch`), with the batch script's keys
    /// and arguments (see `lua/batch.lua`): several checks of one client key, decided in one
    /// call as they would be one by one.
    pub fn batch_function(&self) -> &str {
        &self.batch
    }

    /// The function configuration operations call (`<library>_config`; see
    /// `lua/config.lua`).
    pub fn config_function(&self) -> &str {
        &self.config
    }

    /// The source `FUNCTION LOAD` is given: a `#!lua name=` line, the same Lua as
    /// [`CHECK_SCRIPT`](crate::CHECK_SCRIPT), [`BATCH_SCRIPT`](crate::BATCH_SCRIPT) and
    /// [`CONFIG_SCRIPT`](crate::CONFIG_SCRIPT) without their last lines, and the three
    /// functions' registration.
    pub fn source(&self) -> &str {
        &self.source
    }
}

/// The Redis Function library this build loads, composed once: what a
/// [`RedisBackend`](crate::RedisBackend) in [`ScriptMode::Auto`] loads on each node, and
/// what tools and benchmarks can `FUNCTION LOAD` and `FCALL` themselves.
pub fn library() -> &'static FunctionLibrary {
    static LIBRARY: OnceLock<FunctionLibrary> = OnceLock::new();
    LIBRARY.get_or_init(|| compose(RELEASE, LIBRARY_BODY))
}

fn compose(release: u64, body: &str) -> FunctionLibrary {
    let digest = Sha256::digest(body.as_bytes());
    let hash: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    let name = format!("{LIBRARY_PREFIX}{release}_{hash}");
    let (check, batch, config) = (
        format!("{name}_check"),
        format!("{name}_batch"),
        format!("{name}_config"),
    );
    let source = format!(
        "#!lua name={name}\n{body}\nredis.register_function('{check}', check)\n\
         redis.register_function('{batch}', batch)\n\
         redis.register_function('{config}', config)\n"
    );
    FunctionLibrary {
        name,
        check,
        batch,
        config,
        source,
    }
}

/// The release `N` of a library named `turnstile_<N>_<hash>`, or `None` for any other name.
pub(crate) fn release_of(name: &str) -> Option<u64> {
    let rest = name.strip_prefix(LIBRARY_PREFIX)?;
    let (n, hash) = rest.split_once('_')?;
    let well_formed = !n.is_empty()
        && n.bytes().all(|b| b.is_ascii_digit())
        && !hash.is_empty()
        && hash.bytes().all(|b| b.is_ascii_alphanumeric());
    well_formed.then(|| n.parse().ok()).flatten()
}

/// How a [`RedisBackend`](crate::RedisBackend) runs its Lua on Redis (see
/// [`RedisBackendBuilder::script_mode`](crate::RedisBackendBuilder::script_mode)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScriptMode {
    /// Redis Functions where the node accepts them: the library is loaded once per node
    /// (`FUNCTION LOAD`) and every call is an `FCALL`. A node that refuses `FUNCTION LOAD` or
    /// `FCALL` (Redis before 7.0, an ACL without them, a proxy that does not pass them) is
    /// run with `EVALSHA` instead, which is logged once per backend. The default.
    #[default]
    Auto,
    /// `EVALSHA` only (the script is loaded with `SCRIPT LOAD` on `NOSCRIPT`), even on a node
    /// that offers Functions. Needed behind a proxy that closes the connection on `FUNCTION`
    /// or `FCALL` instead of answering an error: [`Auto`](Self::Auto) cannot tell that from a
    /// dropped connection.
    Eval,
}

/// The path a node's calls take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// Not known yet: the node's (or connection's) first call loads the library.
    Unknown,
    /// `FCALL`: the library is loaded.
    Functions,
    /// `EVALSHA`: the node refused Functions, or the backend runs scripts only.
    Eval,
}

/// An `EVALSHA` script: its source and its SHA-1.
#[derive(Debug)]
struct Script {
    code: &'static str,
    sha1: String,
}

impl Script {
    fn new(code: &'static str) -> Self {
        Script {
            code,
            sha1: redis::Script::new(code).get_hash().to_owned(),
        }
    }
}

/// The Lua a backend runs and how: the library, the `EVALSHA` scripts, the mode.
#[derive(Debug)]
pub(crate) struct Scripts {
    mode: ScriptMode,
    library: &'static FunctionLibrary,
    check: Script,
    batch: Script,
    config: Script,
    fallback_logged: AtomicBool,
    loads: AtomicU64,
}

/// Whether `e` says `FUNCTION LOAD` (or `FCALL`) is refused for good on this node: an error
/// about the request rather than the node (`ERR unknown command` before Redis 7.0, `NOPERM`
/// from an ACL, a proxy's refusal). `READONLY`, `LOADING`, `OOM` and the like are the node's
/// state and handled as any call's.
fn is_refusal(e: &RedisError) -> bool {
    classify(e) == Fault::Request
}

fn already_exists(e: &RedisError) -> bool {
    e.detail().is_some_and(|d| d.contains("already exists"))
}

async fn query(q: &mut impl Query, cmd: &Cmd) -> Result<Value, RedisError> {
    q.query(cmd).await.and_then(errors_out)
}

/// The reply, or the server error it holds ([`Value::extract_error`]), without rebuilding
/// the common reply (an array of integers, a check's) that holds none.
fn errors_out(v: Value) -> Result<Value, RedisError> {
    match &v {
        Value::Array(items) if items.iter().all(|i| matches!(i, Value::Int(_))) => Ok(v),
        _ => v.extract_error(),
    }
}

/// The library names of a `FUNCTION LIST` reply (RESP2 arrays or RESP3 maps).
fn library_names(reply: &Value) -> Vec<String> {
    let Value::Array(libs) = reply else {
        return Vec::new();
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    libs.iter()
        .filter_map(|lib| {
            let pairs: Vec<(&Value, &Value)> = match lib {
                Value::Array(kv) => kv.chunks_exact(2).map(|p| (&p[0], &p[1])).collect(),
                Value::Map(kv) => kv.iter().map(|(k, v)| (k, v)).collect(),
                _ => return None,
            };
            pairs
                .into_iter()
                .find(|(k, _)| text(k).as_deref() == Some("library_name"))
                .and_then(|(_, v)| text(v))
        })
        .collect()
}

impl Scripts {
    pub(crate) fn new(mode: ScriptMode) -> Self {
        Scripts {
            mode,
            library: library(),
            check: Script::new(CHECK_SCRIPT),
            batch: Script::new(BATCH_SCRIPT),
            config: Script::new(CONFIG_SCRIPT),
            fallback_logged: AtomicBool::new(false),
            loads: AtomicU64::new(0),
        }
    }

    /// `FUNCTION LOAD`s and `SCRIPT LOAD`s sent so far.
    pub(crate) fn loads(&self) -> u64 {
        self.loads.load(Ordering::Relaxed)
    }

    /// The Function library's function for `which` (what a [`Call`] is built for).
    pub(crate) fn function(&self, which: Which) -> &str {
        match which {
            Which::Check => &self.library.check,
            Which::Batch => &self.library.batch,
            Which::Config => &self.library.config,
        }
    }

    /// The path of a node whose calls took `known` so far.
    pub(crate) fn path(&self, known: Path) -> Path {
        match self.mode {
            ScriptMode::Eval => Path::Eval,
            _ => known,
        }
    }

    /// Runs `call` on the node `q` reaches, whose calls took `path` so far: loads the
    /// library first when the path is unknown (see [`Self::first_load`]); on `FCALL`'s
    /// "Function not found" loads it and calls once more; on `NOSCRIPT` loads the script and
    /// calls once more (neither first call ran anything). Returns the reply and the path
    /// the node's next calls take.
    pub(crate) async fn invoke(
        &self,
        q: &mut impl Query,
        call: &Call,
        path: Path,
        node: &str,
    ) -> (Result<Value, RedisError>, Path) {
        // The common case, `FCALL` on a node known to have the library, kept small: every
        // other path is boxed, so a call's future carries (and copies) only what it needs.
        if self.path(path) != Path::Functions {
            return Box::pin(self.invoke_other(q, call, path, node)).await;
        }
        match query(q, &call.fcall(self.function(call.which))).await {
            Err(e) if is_not_found(&e) || is_command_refused(&e) => {
                Box::pin(self.recover(q, call, e, node)).await
            }
            r => (r, Path::Functions),
        }
    }

    /// [`Self::invoke`] on a node whose path is not (known to be) [`Path::Functions`].
    async fn invoke_other(
        &self,
        q: &mut impl Query,
        call: &Call,
        path: Path,
        node: &str,
    ) -> (Result<Value, RedisError>, Path) {
        let path = match self.path(path) {
            Path::Unknown => match self.first_load(q, node).await {
                Ok(p) => p,
                Err(e) => return (Err(e), Path::Unknown),
            },
            p => p,
        };
        if path == Path::Eval {
            return (self.evalsha(q, call).await, Path::Eval);
        }
        match query(q, &call.fcall(self.function(call.which))).await {
            Err(e) if is_not_found(&e) || is_command_refused(&e) => {
                self.recover(q, call, e, node).await
            }
            r => (r, Path::Functions),
        }
    }

    /// After `FCALL` failed with `e` without running anything: on "Function not found" loads
    /// the library and calls once more (or falls back to `EVALSHA` when the load is refused);
    /// when `FCALL` itself is refused, runs the call with `EVALSHA`.
    async fn recover(
        &self,
        q: &mut impl Query,
        call: &Call,
        e: RedisError,
        node: &str,
    ) -> (Result<Value, RedisError>, Path) {
        let lib = self.library;
        if !is_not_found(&e) {
            // FCALL itself refused (an ACL, a proxy): nothing ran.
            self.fell_back(node, &e);
            return (self.evalsha(q, call).await, Path::Eval);
        }
        tracing::debug!(node, library = %lib.name, "the Function library is missing: loading it");
        // The command is built again for the second try rather than cloned for every call.
        match self.load(q).await {
            Ok(()) => (
                query(q, &call.fcall(self.function(call.which))).await,
                Path::Functions,
            ),
            Err(e) if is_refusal(&e) => {
                self.fell_back(node, &e);
                (self.evalsha(q, call).await, Path::Eval)
            }
            Err(e) => (Err(e), Path::Functions),
        }
    }

    /// The first load on a node: the library unless `FUNCTION LIST` shows it there, and the
    /// libraries of older releases (`turnstile_<M>_*`, `M` < [`RELEASE`]) deleted — never a
    /// newer release's, nor another build's of this release (which of two builds is newer
    /// cannot be told). Returns [`Path::Eval`] when the node refuses `FUNCTION LOAD`.
    pub(crate) async fn first_load(
        &self,
        q: &mut impl Query,
        node: &str,
    ) -> Result<Path, RedisError> {
        let lib = self.library;
        let mut list = redis::cmd("FUNCTION");
        list.arg("LIST")
            .arg("LIBRARYNAME")
            .arg(format!("{LIBRARY_PREFIX}*"));
        let names = match query(q, &list).await {
            Ok(v) => Some(library_names(&v)),
            // FUNCTION LIST refused (an ACL): load without looking, delete nothing.
            Err(e) if is_refusal(&e) => None,
            Err(e) => return Err(e),
        };
        if !names.as_ref().is_some_and(|n| n.contains(&lib.name)) {
            match self.load(q).await {
                Ok(()) => {}
                Err(e) if is_refusal(&e) => {
                    self.fell_back(node, &e);
                    return Ok(Path::Eval);
                }
                Err(e) => return Err(e),
            }
        }
        for old in names.iter().flatten() {
            if release_of(old).is_some_and(|m| m < RELEASE) {
                let mut delete = redis::cmd("FUNCTION");
                delete.arg("DELETE").arg(old);
                match query(q, &delete).await {
                    Ok(_) => {
                        tracing::info!(node, library = %old, "deleted the Function library of an older turnstile release")
                    }
                    Err(e) => {
                        tracing::debug!(node, library = %old, error = %e, "could not delete an older Function library")
                    }
                }
            }
        }
        Ok(Path::Functions)
    }

    /// `FUNCTION LOAD` of the library; one that exists already (another process loaded it)
    /// is loaded.
    async fn load(&self, q: &mut impl Query) -> Result<(), RedisError> {
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg(&self.library.source);
        self.loads.fetch_add(1, Ordering::Relaxed);
        match query(q, &load).await {
            Ok(_) => Ok(()),
            Err(e) if already_exists(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn fell_back(&self, node: &str, e: &RedisError) {
        if !self.fallback_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                node,
                error = %e,
                "Redis refused Redis Functions (FUNCTION LOAD or FCALL): running the scripts with EVALSHA on this node (logged once)"
            );
        }
    }

    /// `EVALSHA` of the call's script, loaded with `SCRIPT LOAD` on `NOSCRIPT` and called
    /// once more.
    async fn evalsha(&self, q: &mut impl Query, call: &Call) -> Result<Value, RedisError> {
        let script = match call.which {
            Which::Check => &self.check,
            Which::Batch => &self.batch,
            Which::Config => &self.config,
        };
        match query(q, &call.cmd("EVALSHA", &script.sha1)).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(script.code);
                self.loads.fetch_add(1, Ordering::Relaxed);
                query(q, &load).await?;
                query(q, &call.cmd("EVALSHA", &script.sha1)).await
            }
            r => r,
        }
    }
}

/// Whether `e` says the command itself is refused on this node, so it ran nothing:
/// `NOPERM` for the command (an ACL), `ERR unknown command` (Redis before 7.0), a proxy's
/// "unsupported command". Not a script's error, nor `NOPERM` for a key.
fn is_command_refused(e: &RedisError) -> bool {
    let detail = e.detail().unwrap_or_default().to_ascii_lowercase();
    match e.code() {
        Some("NOPERM") => detail.contains("command"),
        Some("ERR") => {
            detail.starts_with("unknown command") || detail.starts_with("unsupported command")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_carries_the_release_and_a_hash_of_the_code() {
        let lib = library();
        assert_eq!(release_of(&lib.name), Some(RELEASE));
        assert!(lib
            .source
            .starts_with(&format!("#!lua name={}\n", lib.name)));
        assert_eq!(lib.check, format!("{}_check", lib.name));
        assert_eq!(lib.config, format!("{}_config", lib.name));
        assert_eq!(lib.batch, format!("{}_batch", lib.name));
        // Other code, another name; the same code, the same name.
        let other = compose(RELEASE, "local function check() end");
        assert_ne!(other.name, lib.name);
        assert_eq!(compose(RELEASE, LIBRARY_BODY).name, lib.name);
        assert_eq!(release("0", "1", "0"), 1000);
        assert!(release("1", "0", "0") > release("0", "999", "999"));
    }

    /// The error of a server reply such as `-NOPERM ...`.
    fn reply(line: &str) -> RedisError {
        match redis::parse_redis_value(format!("{line}\r\n").as_bytes()).unwrap() {
            v @ Value::ServerError(_) => v.extract_error().unwrap_err(),
            other => panic!("not an error reply: {other:?}"),
        }
    }

    #[test]
    fn errors_out_finds_every_server_error_and_keeps_every_reply() {
        let v = |line: &str| redis::parse_redis_value(line.as_bytes()).unwrap();
        let ints = v("*4\r\n:-1733\r\n:0\r\n:999\r\n:1000\r\n");
        assert_eq!(errors_out(ints.clone()).unwrap(), ints);
        for line in [
            "-READONLY You can't write against a read only replica.\r\n",
            "*2\r\n:1\r\n-ERR inner\r\n",
            "*2\r\n*1\r\n-ERR nested\r\n:1\r\n",
        ] {
            assert!(errors_out(v(line)).is_err(), "{line}");
        }
        for line in ["*2\r\n$1\r\na\r\n:1\r\n", "*0\r\n", ":5\r\n", "$-1\r\n"] {
            assert_eq!(errors_out(v(line)).unwrap(), v(line), "{line}");
        }
    }

    #[test]
    fn refusals_are_told_from_script_errors_and_node_states() {
        for line in [
            "-ERR unknown command 'FCALL', with args beginning with: 'f' '1' ",
            "-ERR unknown command 'FUNCTION', with args beginning with: 'LOAD' ",
            "-NOPERM this user has no permissions to run the 'fcall' command",
            "-NOPERM this user has no permissions to run the 'function|load' command",
        ] {
            let e = reply(line);
            assert!(is_command_refused(&e) && is_refusal(&e), "{line}");
        }
        for line in [
            "-TURNSTILE_ARGS malformed arguments",
            "-TURNSTILE_INVALID_STATE invalid state at k",
            "-ERR user_function:12: Script attempted to access nonexistent global variable 'x'",
            "-NOPERM this user has no permissions to access one of the keys used as arguments",
        ] {
            assert!(!is_command_refused(&reply(line)), "{line}");
        }
        for line in [
            "-READONLY You can't write against a read only replica.",
            "-LOADING Redis is loading the dataset in memory",
            "-OOM command not allowed when used memory > 'maxmemory'.",
            "-ERR Function not found",
        ] {
            let e = reply(line);
            assert!(!is_refusal(&e) && !is_command_refused(&e), "{line}");
        }
        assert!(is_not_found(&reply("-ERR Function not found")));
        assert!(already_exists(&reply(
            "-ERR Library 'turnstile_1000_abc' already exists"
        )));
    }

    #[test]
    fn function_list_replies_give_the_library_names_in_both_protocols() {
        let s = |v: &str| Value::BulkString(v.as_bytes().to_vec());
        let resp2 = Value::Array(vec![
            Value::Array(vec![
                s("library_name"),
                s("turnstile_1000_abc"),
                s("engine"),
                s("LUA"),
            ]),
            Value::Array(vec![s("engine"), s("LUA"), s("library_name"), s("other")]),
        ]);
        assert_eq!(library_names(&resp2), ["turnstile_1000_abc", "other"]);
        let resp3 = Value::Array(vec![Value::Map(vec![
            (s("library_name"), s("turnstile_7_x")),
            (s("engine"), s("LUA")),
        ])]);
        assert_eq!(library_names(&resp3), ["turnstile_7_x"]);
        assert!(library_names(&Value::Nil).is_empty());
    }

    #[test]
    fn only_turnstile_library_names_have_a_release() {
        assert_eq!(release_of("turnstile_1000_0a1b2c3d4e5f"), Some(1000));
        assert_eq!(release_of("turnstile_7_x"), Some(7));
        for other in [
            "turnstile_",
            "turnstile__abc",
            "turnstile_12",
            "turnstile_12_",
            "turnstile_+1_abc",
            "turnstile_1_a-b",
            "other_1_abc",
            "turnstile_99999999999999999999999_abc",
        ] {
            assert_eq!(release_of(other), None, "{other}");
        }
    }
}
