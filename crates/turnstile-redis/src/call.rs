//! [`Call`]: one call's keys and arguments, sent as `FCALL` or `EVALSHA`.

use deadpool_redis::redis::{Arg, Cmd, ToRedisArgs};

/// What a call runs: the check function (checks, refunds, resets) or the configuration one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Which {
    Check,
    Config,
}

/// One call's keys and arguments, sent as `FCALL` or `EVALSHA` (see [`Scripts::invoke`]).
///
/// The keys and arguments are kept in one buffer (a [`Cmd`] that is never sent itself), so
/// building a call and its command costs a few allocations whatever its argument count.
///
/// [`Scripts::invoke`]: crate::library::Scripts::invoke
#[derive(Debug)]
pub(crate) struct Call {
    pub(crate) which: Which,
    /// How many of `parts`' leading values are keys.
    keys: usize,
    /// The keys, then the arguments.
    parts: Cmd,
}

impl Call {
    pub(crate) fn new(which: Which) -> Self {
        Call {
            which,
            keys: 0,
            parts: Cmd::with_capacity(8, 128),
        }
    }

    /// Adds an argument (`ARGV[i]` in the Lua), after every key.
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.parts.arg(arg);
        self
    }

    /// Adds a key (`KEYS[i]` in the Lua); keys come before any argument.
    pub(crate) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        debug_assert_eq!(self.keys, self.parts.args_iter().len(), "a key after an argument");
        self.parts.arg(key);
        self.keys = self.parts.args_iter().len();
        self
    }

    /// `<command> <function or sha1> <key count> <keys...> <args...>`.
    pub(crate) fn cmd(&self, command: &str, target: &str) -> Cmd {
        let parts = self.parts.args_iter();
        let len: usize = parts
            .clone()
            .map(|a| match a {
                Arg::Simple(b) => b.len(),
                _ => 0,
            })
            .sum();
        // The key count has at most 20 digits.
        let mut cmd = Cmd::with_capacity(3 + parts.len(), command.len() + target.len() + 20 + len);
        cmd.arg(command).arg(target).arg(self.keys);
        for part in parts {
            if let Arg::Simple(b) = part {
                cmd.arg(b);
            }
        }
        cmd
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deadpool_redis::redis;

    #[test]
    fn a_call_is_its_command_name_target_key_count_keys_and_arguments_in_order() {
        let mut call = Call::new(Which::Check);
        call.key("k1").key(String::from("k2"));
        call.arg("").arg(42_u64).arg("check defaults 0").arg(b"\n1.1.1000.9 x".as_slice());
        let expected = redis::cmd("FCALL")
            .arg("f")
            .arg(2)
            .arg("k1")
            .arg("k2")
            .arg("")
            .arg(42_u64)
            .arg("check defaults 0")
            .arg(b"\n1.1.1000.9 x".as_slice())
            .get_packed_command();
        assert_eq!(call.cmd("FCALL", "f").get_packed_command(), expected);
        let none = Call::new(Which::Config);
        assert_eq!(
            none.cmd("EVALSHA", "s").get_packed_command(),
            redis::cmd("EVALSHA").arg("s").arg(0).get_packed_command()
        );
    }
}
