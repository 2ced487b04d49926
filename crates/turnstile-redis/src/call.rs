//! [`Call`]: one call's keys and arguments, sent as `FCALL` or `EVALSHA`.

use deadpool_redis::redis::{self, Cmd, ToRedisArgs};

/// What a call runs: the check function (checks, refunds, resets) or the configuration one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Which {
    Check,
    Config,
}

/// One call's keys and arguments, sent as `FCALL` or `EVALSHA` (see [`Scripts::invoke`]).
#[derive(Debug)]
pub(crate) struct Call {
    pub(crate) which: Which,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Call {
    pub(crate) fn new(which: Which) -> Self {
        Call {
            which,
            keys: Vec::with_capacity(1),
            args: Vec::with_capacity(16),
        }
    }

    /// Adds an argument (`ARGV[i]` in the Lua).
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// Adds a key (`KEYS[i]` in the Lua).
    pub(crate) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    /// `<command> <function or sha1> <key count> <keys...> <args...>`.
    pub(crate) fn cmd(&self, command: &str, target: &str) -> Cmd {
        let mut cmd = redis::cmd(command);
        cmd.arg(target)
            .arg(self.keys.len())
            .arg(&*self.keys)
            .arg(&*self.args);
        cmd
    }
}
