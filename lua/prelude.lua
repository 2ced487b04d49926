-- turnstile: shared helpers for the per-algorithm pieces and check.lua.
--
-- Lua numbers in Redis are IEEE doubles: every integer below 2^53 is exact, and so is every
-- sum, difference and product that stays below 2^53. SEMANTICS.md bounds max(L, B) * P
-- below 2^53, and every piece keeps its intermediates under that bound. Division is done
-- with math.fmod, which is exact for doubles, never with '/' followed by floor.

-- Exact integer division of a >= 0 by b > 0: quotient and remainder.
local function divmod(a, b)
  local r = math.fmod(a, b)
  return (a - r) / b, r
end

-- ceil(a / b) for a >= 0, b > 0.
local function ceildiv(a, b)
  local q, r = divmod(a, b)
  if r > 0 then q = q + 1 end
  return q
end

local function min(a, b)
  if a < b then return a end
  return b
end

-- An exact duration in ms as {whole, num, den}: whole + num / den, 0 <= num < den.
local ZERO = {0, 0, 1}
local function dur(num, den)
  local q, r = divmod(num, den)
  return {q, r, den}
end
local function dur_ms(ms) return {ms, 0, 1} end
-- whole ms rounded up, for PEXPIRE / SET PX
local function dur_ceil(d)
  if d[2] > 0 then return d[1] + 1 end
  return d[1]
end

-- Integers as text, exactly (tostring would print 15+ digit numbers in exponent form).
local function int(n) return string.format('%.0f', n) end

local TWO53 = 9007199254740992

-- A non-negative integer below 2^53 from text, or nil.
local function nat(s)
  local n = tonumber(s)
  if not n or n < 0 or n >= TWO53 or n ~= math.floor(n) then return nil end
  return n
end

local function split(s, sep)
  local parts = {}
  for field in string.gmatch(s, '[^' .. sep .. ']+') do parts[#parts + 1] = field end
  return parts
end

local function bad(key)
  return {err = 'TURNSTILE_INVALID_STATE invalid state at ' .. key}
end

-- Parameters "alg.L.P.B" (as stored with every state) into a table, or nil.
local function parse_params(s)
  local a, l, p, b = string.match(s, '^(%d+)%.(%d+)%.(%d+)%.(%d+)$')
  if not a then return nil end
  a, l, p, b = nat(a), nat(l), nat(p), nat(b)
  if not a or not l or not p or not b or l < 1 or p < 1 or b < 1 or a < 1 or a > 6 then
    return nil
  end
  return {alg = a, L = l, P = p, B = b}
end

local function store(key, value, ttl)
  redis.call('SET', key, value, 'PX', ttl)
end

-- A policy's result. retry == nil means no wait can help ("never"). r.new, when set, is
-- the state to store if the request is admitted.
local function result(allowed, remaining, retry, reset, delay)
  return {allowed = allowed, remaining = remaining, retry = retry, reset = reset,
          delay = delay or ZERO}
end

local function is_bucket(alg) return alg == 1 or alg == 2 or alg == 3 end

local ALG = {}
