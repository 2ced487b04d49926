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

-- Splits a stored state "a|b|c" into numbers after the fingerprint; nil if it is not of
-- the expected shape (count numbers, all non-negative integers below 2^53).
local function parse_state(raw, fp, count, key)
  if not raw then return nil end
  local parts = {}
  for field in string.gmatch(raw, '[^|]+') do parts[#parts + 1] = field end
  if parts[1] ~= fp then return nil end -- another policy's state: start fresh
  if #parts ~= count + 1 then
    return redis.error_reply('TURNSTILE_INVALID_STATE invalid state at ' .. key)
  end
  local nums = {}
  for i = 2, #parts do
    local n = tonumber(parts[i])
    if not n or n < 0 or n >= 9007199254740992 or n ~= math.floor(n) then
      return redis.error_reply('TURNSTILE_INVALID_STATE invalid state at ' .. key)
    end
    nums[i - 1] = n
  end
  return nums
end

local function store(key, value, ttl)
  redis.call('SET', key, value, 'PX', ttl)
end

-- A policy's result. retry == nil means no wait can help ("never").
local function result(allowed, remaining, retry, reset, delay)
  return {allowed = allowed, remaining = remaining, retry = retry, reset = reset,
          delay = delay or ZERO}
end

local ALG = {}
