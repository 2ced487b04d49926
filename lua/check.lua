-- turnstile: one atomic call for one client key: check a request against the key's
-- policies, or give quota back (refund), or forget its state (reset).
--
-- Composed after prelude.lua, the algorithms' arithmetic (bucket.lua, gcra.lua,
-- fixed_window.lua, sliding_window.lua, sliding_log.lua: each family's written once, which
-- every path calls), outcome.lua (the all-or-nothing rule), fast.lua (the path of
-- the common case: a check under the defaults of a key without configuration), sets.lua
-- (the arguments parsed) and general_path (reading.lua, the algorithms' methods in
-- methods.lua and log_list.lua, states.lua and general.lua: the general path, built only
-- when a call needs it). It defines check(KEYS, ARGV), which the
-- Rust side composes into both the Redis Function library (registered there and called with
-- FCALL: every definition above, the general path's included, runs once, at FUNCTION LOAD;
-- an algorithm's methods when a call first uses it) and the EVALSHA script (the definitions,
-- then `return check(KEYS, ARGV)`: every call runs the top-level definitions again, and the
-- general path's only when it takes it). Everything is local: a Function library may create
-- or read no global at run time.
--
-- KEYS[1] the client's state string, <prefix>:{<tag>}:f4 ('f4' the stored format's version,
--         STATE_FORMAT in prelude.lua): every policy's state of the client key in one
--         string, after a header saying whether the key had a configuration when it was
--         written (see states.lua). Every other key this call touches is derived from it,
--         all in its Cluster slot (the same hash tag): the configuration hash <prefix>:{<tag>}
--         ~cfg (o = its override, lines "alg L P B name"; t = its tier; v = its version), read
--         only when the state string does not say there is none (a fresh key: one EXISTS),
--         and a sliding log's list <prefix>:{<tag>}~log:f4:<policy name>.
-- ARGV[1] "<op> <unconfigured> <least TTL> <cost>[ <time>]": op 'check', 'refund' or
--         'reset'; for a key without configuration 'defaults', 'deny' or 'allow' ('stored':
--         only the policies the key's override or tier names apply, none without them); the least
--         TTL in ms of a written key (0; 600000 with explicit simulation time); the cost
--         (check, refund), 0 <= cost <= 2^53 - 1, 0 a query; and the time in ms since the
--         epoch, absent to use the server's TIME (production). One argument: the common
--         case's text is the same on every call, so a Function library parses it once.
-- ARGV[2] and on: one argument per policy set, the defaults first, then the tiers: its tier
--         name ('' for the defaults), then per policy a line "\n<alg.L.P.B> <name>": its
--         parameters (algorithm id, ALG in prelude.lua and turnstile_core's
--         Algorithm::wire_id: 1 token bucket, 2 gcra, 3 leaky bucket, 4 fixed window,
--         5 sliding log, 6 sliding window; limit L; period P in ms; capacity: burst B for
--         buckets, L for windows), the very text its stored state begins with, and its name
--         (names and tiers hold no line break). The caller encodes a set once; a Function
--         library parses each set (and ARGV[1]) once per node (see SETS), so a call costs
--         one key, two arguments and a table look-up whatever its policies.
--
-- Design (issue 15): the common case makes three Redis calls whatever the number of
-- policies — TIME, GET and PSETEX of the one string (fast.lua) — where one key per policy
-- and the configuration's probe made 2 + 2 per policy; a sliding log adds its list's own
-- three (its oldest entry, the new one, its TTL). Whatever creates or changes the
-- configuration hash (config.lua, a refund's or reset's version bump) marks the string in
-- the same atomic call, so the fast path never decides under a configuration it did not
-- read.
--
-- Stored states begin with their parameters "alg.L.P.B"; a state written under other
-- parameters carries over by the rule of SEMANTICS-level carry_over (see turnstile-core's
-- algorithm::carry_over), evaluated at this call and stored only with an admitted request.
--
-- check is all-or-nothing: every policy is evaluated first; only if all admit (and cost >
-- 0) is any state written. When the request is denied, the policies that would have
-- admitted report their fields as if nothing were consumed (outcome.lua's
-- as_if_nothing_consumed, on both paths).
--
-- Errors (error replies change nothing): TURNSTILE_ARGS for malformed arguments;
-- TURNSTILE_TOO_MANY_POLICIES for a set of more than MAX_POLICIES (prelude.lua) policies;
-- TURNSTILE_INVALID_STATE when the configuration cannot be read (every operation: which
-- policies apply is unknown; config.lua's 'clear' removes it) or, for check and refund, a
-- policy's state (any line of the state string) cannot (see read_states and decode). reset
-- forgets the applying policies' states whatever they hold (a string that cannot be read:
-- all of it), so it repairs a key holding garbage.
--
-- Returns {now, version, applied (0 defaults, 1 override, 2 tier, 3 denied, 4 unlimited),
-- then, when applied is 1 (some policy's parameters are the key's override's) or 2 (some
-- are its stored tier's, none the override's): the stored tier's name ('' for none), and per
-- default policy in order its mark (-1 it does not apply, 0 the default, 1 the override's
-- policy of its name, 2 the tier's: general.lua's applying), [alg, L, P, B, name: only for
-- mark 1, whose parameters the caller does not know], its result (none for -1); for
-- applied 0, per default policy its result (the caller's own policies, in its order). A
-- result is as many values as its algorithm writes (a.width), every duration exact:
--   token bucket, GCRA:   retry, remaining, reset           durations: numerators over L ms
--   leaky bucket:         retry, remaining, reset, delay    durations: numerators over L ms
--   fixed window, log:    retry, remaining, reset           durations: whole ms
--   sliding window:       retry whole, num, den, remaining, reset (whole ms)
-- retry -1 (with num 0, den 1) is never; the policy admits exactly when retry is 0 (a
-- denial's retry is always above 0). refund and reset answer as a query (cost 0) made
-- after them.
-- The compact reply of the common case (fast.lua: the defaults applied, version 0) drops
-- version and applied and gives -1 - now in now's place: {-1 - now, then per policy its
-- result}. A first value below 0 marks it (now is never below 0).

-- The server's last TIME seconds (a string) and them in ms.
local TIME_S, TIME_MS = nil, 0

-- The general path (general.lua's general), once general_path has built it: by the first
-- call that needs it (with EVALSHA, a call that needs it), or by the Function library at
-- load (wire/compose.rs).
local GENERAL = nil

-- The server's time in ms: its TIME reply, two decimal integers (seconds, microseconds),
-- read by arithmetic directly, as nat would read them; the seconds' product is kept while
-- they stay the same (the same text: one comparison of interned strings).
local function server_ms()
  local t = redis.call('TIME')
  local s, us = t[1], t[2] + 0
  if s ~= TIME_S then TIME_S, TIME_MS = s, s * 1000 end
  local r = us % 1000
  return TIME_MS + (us - r) / 1000
end

-- The reply of a check of the state string at key (KEYS[1]) at now (ms), once check has read
-- its flags (flags_of's answer); ARGV is check's (the policy sets). batch.lua decides each
-- check of a batch with it too.
local function decide(ARGV, key, flags, now)
  -- The common case first (fast.lua): a check under the defaults' set (parsed before: its
  -- memo) of a key whose state string was written without configuration, or a fresh key
  -- without one; anything else, or fast_check's nil, takes the general path (general.lua).
  if flags.fast then
    -- (With EVALSHA the memo is empty at every call: the set is parsed here.)
    local set = SETS[ARGV[2]] or (ARGV[2] and set_of(ARGV[2]))
    if set and set.defaults then
      local out = fast_check(set, key, now, flags.cost, flags[3], cfgkey_of)
      if out then return out end
    end
  end
  if not GENERAL then GENERAL = general_path() end
  return GENERAL(ARGV, key, flags, now)
end

local function check(KEYS, ARGV)
  if not match then bind() end
  local text, key = ARGV[1], KEYS[1]
  local flags = FLAGS[text or false] or (text and flags_of(text))
  if not flags or not key then
    return redis.error_reply('TURNSTILE_ARGS malformed arguments')
  end
  return decide(ARGV, key, flags, flags.time or server_ms())
end
