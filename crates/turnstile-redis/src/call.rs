//! [`Call`]: one call's keys and arguments, sent as `FCALL` or `EVALSHA`.

use std::cell::Cell;

use deadpool_redis::redis::{Arg, Cmd, ToRedisArgs};

/// What a call runs: the check function (checks, refunds, resets) or the configuration one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Which {
    Check,
    Config,
}

/// One call's keys and arguments, sent as `FCALL` or `EVALSHA` (see `Scripts::invoke`).
///
/// The call is built as the `FCALL` command it is on Redis 7 (`FCALL <function> <key count>
/// <keys...> <args...>`), so that command is sent as it is; `EVALSHA` (the fallback) is
/// built from it when needed.
#[derive(Debug)]
pub(crate) struct Call {
    pub(crate) which: Which,
    /// How many keys the call has.
    keys: usize,
    /// `FCALL <function> <key count>`, then the keys, then the arguments.
    fcall: Cmd,
}

/// The values of `fcall` before its keys: `FCALL`, the function, the key count.
const HEAD: usize = 3;

/// The largest buffer (bytes) a finished call's command hands on to the next call.
const SPARE_MAX: usize = 4096;

thread_local! {
    /// A finished call's command, cleared, whose buffers the next call on this thread reuses
    /// ([`Cmd::clear`] keeps them): a call then allocates nothing for its command.
    static SPARE: Cell<Option<Cmd>> = const { Cell::new(None) };
}

impl Call {
    /// A call of `function` (the Function library's function for `which`) with `keys` keys,
    /// to be added with [`key`](Self::key) before any argument.
    pub(crate) fn new(which: Which, function: &str, keys: usize) -> Self {
        let mut fcall = SPARE
            .try_with(Cell::take)
            .ok()
            .flatten()
            .unwrap_or_else(|| Cmd::with_capacity(HEAD + 5, 160));
        fcall.arg("FCALL").arg(function).arg(keys);
        Call { which, keys, fcall }
    }

    /// Adds an argument (`ARGV[i]` in the Lua), after every key.
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        debug_assert!(
            self.fcall.args_iter().len() >= HEAD + self.keys,
            "an argument before a key"
        );
        self.fcall.arg(arg);
        self
    }

    /// Adds a key (`KEYS[i]` in the Lua); keys come before any argument.
    pub(crate) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        self.fcall.arg(key);
        debug_assert!(
            self.fcall.args_iter().len() <= HEAD + self.keys,
            "more keys than said"
        );
        self
    }

    /// The `FCALL` command of `function`: the one built when it is the call's own function,
    /// else another.
    pub(crate) fn fcall(&self, function: &str) -> std::borrow::Cow<'_, Cmd> {
        let own = matches!(self.fcall.args_iter().nth(1), Some(Arg::Simple(f)) if f == function.as_bytes());
        if own {
            std::borrow::Cow::Borrowed(&self.fcall)
        } else {
            std::borrow::Cow::Owned(self.cmd("FCALL", function))
        }
    }

    /// `<command> <function or sha1> <key count> <keys...> <args...>`.
    pub(crate) fn cmd(&self, command: &str, target: &str) -> Cmd {
        let parts = self.fcall.args_iter().skip(HEAD);
        let len: usize = parts
            .clone()
            .map(|a| match a {
                Arg::Simple(b) => b.len(),
                _ => 0,
            })
            .sum();
        // The key count has at most 20 digits.
        let mut cmd =
            Cmd::with_capacity(HEAD + parts.len(), command.len() + target.len() + 20 + len);
        cmd.arg(command).arg(target).arg(self.keys);
        for part in parts {
            if let Arg::Simple(b) = part {
                cmd.arg(b);
            }
        }
        cmd
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        let mut cmd = std::mem::take(&mut self.fcall);
        // Its buffers are about as large as what it held (a few hundred bytes for a check).
        let held: usize = cmd
            .args_iter()
            .map(|a| match a {
                Arg::Simple(b) => b.len(),
                _ => 0,
            })
            .sum();
        if held <= SPARE_MAX {
            cmd.clear();
            // Not at all while the thread's locals are being destroyed.
            let _ = SPARE.try_with(|s| s.set(Some(cmd)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deadpool_redis::redis;

    #[test]
    fn a_call_is_its_command_name_target_key_count_keys_and_arguments_in_order() {
        let mut call = Call::new(Which::Check, "f", 2);
        call.key("k1").key(String::from("k2"));
        call.arg("check defaults 0 1")
            .arg(42_u64)
            .arg(b"\n1.1.1000.9 x".as_slice());
        let packed = |command: &str, target: &str| {
            redis::cmd(command)
                .arg(target)
                .arg(2)
                .arg("k1")
                .arg("k2")
                .arg("check defaults 0 1")
                .arg(42_u64)
                .arg(b"\n1.1.1000.9 x".as_slice())
                .get_packed_command()
        };
        assert_eq!(call.fcall("f").get_packed_command(), packed("FCALL", "f"));
        assert!(matches!(call.fcall("f"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(call.fcall("g").get_packed_command(), packed("FCALL", "g"));
        assert_eq!(
            call.cmd("EVALSHA", "s").get_packed_command(),
            packed("EVALSHA", "s")
        );
        let none = Call::new(Which::Config, "c", 0);
        assert_eq!(
            none.cmd("EVALSHA", "s").get_packed_command(),
            redis::cmd("EVALSHA").arg("s").arg(0).get_packed_command()
        );
        assert_eq!(
            none.fcall("c").get_packed_command(),
            redis::cmd("FCALL").arg("c").arg(0).get_packed_command()
        );
    }

    #[test]
    fn a_call_after_a_finished_one_holds_only_its_own_values() {
        let mut first = Call::new(Which::Check, "f", 1);
        first.key("a-long-key-".repeat(20)).arg("x".repeat(300));
        drop(first);
        let mut second = Call::new(Which::Config, "c", 1);
        second.key("k").arg("v");
        assert_eq!(
            second.fcall("c").get_packed_command(),
            redis::cmd("FCALL")
                .arg("c")
                .arg(1)
                .arg("k")
                .arg("v")
                .get_packed_command()
        );
    }
}
