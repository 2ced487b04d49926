-- turnstile: shared helpers of every script (check.lua with the per-algorithm pieces, and
-- config.lua).
--
-- Lua numbers in Redis are IEEE doubles: every integer below 2^53 is exact, and so is every
-- sum, difference and product that stays below 2^53. SEMANTICS.md bounds times and costs by
-- 2^53 - 1 and max(L, B) * P by 2^53 - 1, and every piece keeps its intermediates inside
-- those bounds: a time plus a period can pass 2^53, so times are compared and subtracted
-- before anything is added to them (now - t < P, never t + P > now), and no state holds an
-- absolute time plus a duration.
--
-- Division: for integers 0 <= a <= 2^53 - 1 and b >= 1, Lua 5.1's a % b (a - floor(a / b) * b,
-- computed inline by the VM, no function call) is exact. With q = floor of the true a / b and
-- a = q * b + r, 0 <= r < b, the true quotient is at least 1 / b below q + 1, while the
-- rounding of a / b moves it by at most half an ulp, which is below a / b * 2^-53 < 1 / b:
-- so floor(a / b) is q, q * b <= a is exact, and so is a - q * b. (a - r) / b is then exact
-- too (a multiple of b divided by b).
--
-- Everything read from Redis is parsed strictly (nat, the anchored state patterns,
-- policy_of): a value Lua's tonumber happens to accept ('0x10', ' 1', '1e3', 'inf', '-0',
-- '1.0') is invalid state, reported as TURNSTILE_INVALID_STATE, never guessed at. A string
-- of digits only may then be turned into its number by arithmetic (s + 0: Lua reads it in
-- decimal, as tonumber would, without a function call).

-- The string functions the hot paths use, as upvalues: bound by bind() at the start of
-- every call (check and config call it first), since loading a Function library may read no
-- global at all (not even string).
local find, match, format
local function bind()
  find, match, format = string.find, string.match, string.format
end

-- Exact integer division of a >= 0 by b > 0: quotient and remainder (see above).
local function divmod(a, b)
  local r = a % b
  return (a - r) / b, r
end

-- Durations: every algorithm writes its reply's durations as exact integers over a
-- denominator the caller knows (see check.lua's header), so no duration is a table.

-- Integers as text, exactly: '%d' formats the number as a C long (64 bits), exact for every
-- integer below 2^53 and much cheaper than '%.0f' (tostring would print 15+ digit numbers in
-- exponent form).
local function int(n) return format('%d', n) end

-- The contract's bounds (SEMANTICS.md "Inputs"; turnstile_core::policy's MAX_* constants).
local MAX_EXACT = 9007199254740991 -- 2^53 - 1: times, costs, max(L, B) * P
local MAX_LIMIT = 4294967295 -- 2^32 - 1: L and B
local MAX_PERIOD = 31536000000 -- 365 days in ms
-- The most policies one set may hold (turnstile_core::MAX_POLICIES): a set or an override
-- with more is refused (TURNSTILE_TOO_MANY_POLICIES), so no call holds Redis for long.
local MAX_POLICIES = 512

-- The one parser of integers: a non-negative integer <= 2^53 - 1 written in decimal digits
-- only (leading zeros allowed), else nil. Redis replies and arguments arrive as strings;
-- anything else (nil, false) is not a number either.
local function nat(s)
  if type(s) ~= 'string' or not find(s, '^%d+$') then return nil end
  -- Digits only, so s + 0 reads them in decimal; a value of 2^53 or more rounds to a
  -- double of 2^53 or more (rounding is monotonic), never to one below.
  local n = s + 0
  if n > MAX_EXACT then return nil end
  return n
end

-- s split at every sep (one plain character), empty fields kept: 'a||b' is {'a', '', 'b'}.
local function fields(s, sep)
  local parts, from = {}, 1
  while true do
    local at = string.find(s, sep, from, true)
    if not at then
      parts[#parts + 1] = string.sub(s, from)
      return parts
    end
    parts[#parts + 1] = string.sub(s, from, at - 1)
    from = at + 1
  end
end

-- The version of the stored states' format, part of every state and log key whatever the
-- prefix (keys::STATE_FORMAT on the Rust side): a release that stores states differently
-- uses other keys, so no release ever reads another's format. 'f4': all of a client key's
-- policy states in one string at <prefix>:{<tag>}:f4, after a header saying whether the key
-- had a configuration when it was written (states.lua), GCRA's state the token bucket's
-- (updated, debt) and the windows' without their window index (it is updated's). Before it,
-- 'f3' had the same layout with GCRA's state as updated, ahead, frac and the windows' index
-- stored, 'f2' kept one key per policy (<prefix>:{<tag>}:f2:<name>), and format 1
-- (unversioned keys) GCRA's TAT absolute.
-- Configurations (~cfg) keep their key: their format is unchanged.
local STATE_FORMAT = 'f4'
-- The state string's key is the key base and this suffix.
local FORMAT_SUFFIX = ':' .. STATE_FORMAT

-- Marks the state string at key (if it is one written without configuration, header '0')
-- as written with one (header 'c'), keeping its TTL: whatever creates or changes a key's
-- configuration hash calls it in the same atomic call, so the fast path never decides from
-- a string whose header no longer tells the truth. Anything else at key is left as it is
-- (nothing, another type, garbage: none of them is ever decided from without reading the
-- configuration).
local function mark_configured(key)
  if redis.pcall('GETRANGE', key, 0, 0) == '0' then redis.call('SETRANGE', key, 0, 'c') end
end

-- The algorithms by id (check.lua's header lists them; turnstile_core's Algorithm::wire_id
-- and wire_width give the same table, and a test compares them): ALG[id] is the algorithm's
-- table, nil for an id no algorithm has. Its shape is here — fields: the count of numbers
-- its stored state holds after its parameters; width: the count of values its result takes
-- in a reply (Algorithm::wire_width) — and its methods on the general path's states (fresh,
-- parse, decide, admitted, refund, encode) are METHODS[id], which methods.lua and
-- log_list.lua define inside general_path (see general.lua's header): the fast path
-- (fast.lua) and the parsing of the arguments (sets.lua) need only the shapes, so an
-- EVALSHA call the fast path decides creates none of the methods. Once general_path has
-- run, algorithm(id) adds the methods to ALG[id] the first time it is asked for it (the
-- general path asks for every algorithm it uses, see with_keys); a Function library keeps
-- them from call to call. Plain tables and functions, no metatable: loading a Function
-- library offers no setmetatable.
local METHODS, ALG = {}, {
  {fields = 2, width = 3}, -- 1 token-bucket
  {fields = 2, width = 3}, -- 2 gcra
  {fields = 2, width = 4}, -- 3 leaky-bucket
  {fields = 2, width = 3}, -- 4 fixed-window
  {fields = 2, width = 3}, -- 5 sliding-log
  {fields = 3, width = 5}, -- 6 sliding-window
}
local function algorithm(id)
  local a = ALG[id]
  local m = METHODS[id]
  if a and not a.decide and m then
    a.fresh, a.parse, a.decide, a.admitted, a.refund, a.encode =
      m.fresh, m.parse, m.decide, m.admitted, m.refund, m.encode
  end
  return a
end

local function is_bucket(alg) return alg == 1 or alg == 2 or alg == 3 end

-- A policy's parameters, numbers already parsed, if they are a policy the contract accepts
-- (SEMANTICS.md "Inputs"): an algorithm's id (ALG above), 1 <= L <= 2^32 - 1, 1 <= P <= 365 days in
-- ms, capacity 1 <= B <= 2^32 - 1 (equal to L for the windows), max(L, B) * P <= 2^53 - 1
-- (compared without forming the product). Returns {alg, L, P, B}, or nil.
local function policy_of(alg, L, P, B)
  if not alg or not L or not P or not B then return nil end
  if not ALG[alg] or L < 1 or L > MAX_LIMIT or P < 1 or P > MAX_PERIOD or B < 1
     or B > MAX_LIMIT then
    return nil
  end
  if not is_bucket(alg) and B ~= L then return nil end
  local most = L
  if B > most then most = B end
  if most > divmod(MAX_EXACT, P) then return nil end
  return {alg = alg, L = L, P = P, B = B}
end

-- Whether name is a policy name turnstile_core accepts (Policy::with_name): 1 to 200
-- printable ASCII characters (0x20 to 0x7E) other than '"' and '\'.
local function valid_name(name)
  -- %c: the control characters, 0x00 to 0x1F and 0x7F (C locale).
  return type(name) == 'string' and #name >= 1 and #name <= 200
    and not string.find(name, '[%c"\\\128-\255]')
end

-- Whether t is a tier name turnstile_core accepts (quota::validate_tier_name): 1 to 64 ASCII
-- letters, digits, '-', '_' and '.'.
local function valid_tier(t)
  return type(t) == 'string' and #t >= 1 and #t <= 64 and not string.find(t, '[^%w%-_%.]')
end

-- An override as stored in a configuration hash: lines "alg L P B name", one per policy,
-- separated by '\n' (no empty line, names unique). Returns a list of {alg, L, P, B, name},
-- or nil.
local function parse_override(s)
  local out, seen = {}, {}
  local lines = fields(s, '\n')
  if #lines > MAX_POLICIES then return nil end
  for _, line in ipairs(lines) do
    local f = fields(line, ' ')
    if #f < 5 then return nil end
    local p = policy_of(nat(f[1]), nat(f[2]), nat(f[3]), nat(f[4]))
    -- The name is the rest of the line (it may hold spaces).
    local name = table.concat(f, ' ', 5)
    if not p or not valid_name(name) or seen[name] then return nil end
    seen[name] = true
    p.name = name
    out[#out + 1] = p
  end
  return out
end

-- Why a configuration (config.lua's read_config's reply; check's HMGET) cannot be used, or
-- nil when it can.
local function config_problem(cfg)
  if cfg[3] and not nat(cfg[3]) then return 'its version is not an integer' end
  if cfg[1] and not parse_override(cfg[1]) then return 'its override is not a valid policy list' end
  if cfg[2] and not valid_tier(cfg[2]) then return 'its tier is not a valid tier name' end
  return nil
end

