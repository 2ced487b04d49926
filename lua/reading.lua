-- turnstile: helpers of check's general path only (the algorithms' methods in methods.lua
-- and log_list.lua, states.lua, general.lua), composed first inside general_path() (see
-- general.lua's header), so that an EVALSHA call the fast path decides does not create
-- them: exact arithmetic, and the strict reading of stored states (see prelude.lua's
-- header).

-- ceil(a / b) for a >= 0, b > 0.
local function ceildiv(a, b)
  local r = a % b
  if r > 0 then return (a - r) / b + 1 end
  return a / b
end

local function min(a, b)
  if a < b then return a end
  return b
end

-- Where a query whose reply nobody reads writes it: a refund or a carry-over asks an
-- algorithm's arithmetic for the numbers at now (the debt, the counts), not for its reply.
local SCRATCH = {}

-- A state's numbers after its parameters, by their count: digits only, '|' between them.
-- The first capture is the parameters' text (anything up to the first '|'), compared with the
-- policy's own as a whole string.
local STATE_FIELDS = {
  [2] = '^([^|]*)|(%d+)|(%d+)$',
  [3] = '^([^|]*)|(%d+)|(%d+)|(%d+)$',
  [4] = '^([^|]*)|(%d+)|(%d+)|(%d+)|(%d+)$',
}

-- The error of a policy's state that cannot be read (at key: its state or its log). A reset
-- forgets it.
local function bad(key, why)
  local m = 'TURNSTILE_INVALID_STATE invalid state at ' .. key
  if why then m = m .. ': ' .. why end
  return {err = m .. '; resetting the client key (turnstile quota reset) forgets it'}
end

-- A read of key: redis.pcall, with an error reply (a key of another type: WRONGTYPE) turned
-- into invalid state at key rather than a script error. Returns the reply, or nil and the
-- error.
local function read(key, ...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then return nil, bad(key, r.err) end
  return r
end

-- Parameters "alg.L.P.B" (as stored with every state) into a policy, or nil.
local function parse_params(s)
  local f = fields(s, '.')
  if #f ~= 4 then return nil end
  return policy_of(nat(f[1]), nat(f[2]), nat(f[3]), nat(f[4]))
end
