-- turnstile: one atomic check of one client key against any number of policies.
--
-- Composed after prelude.lua and the per-algorithm pieces (bucket.lua, gcra.lua,
-- fixed_window.lua, sliding_window.lua, sliding_log.lua) into one script, run with EVALSHA.
--
-- KEYS     per policy, in order: its state key; a sliding-log policy (algorithm 5) also its
--          log key right after. All keys of one call share one Cluster hash tag.
-- ARGV[1]  the time in ms since the epoch, or '' to use the server's TIME (production)
-- ARGV[2]  the cost, 0 <= cost <= 2^53 - 1 (0 is a query)
-- ARGV[3]  the least TTL in ms of a written key (0; 600000 with explicit simulation time)
-- ARGV[4]  the number of policies N
-- then per policy: algorithm id (1 token bucket, 2 gcra, 3 leaky bucket, 4 fixed window,
--          5 sliding log, 6 sliding window), limit L, period P in ms, capacity (burst B for
--          buckets, L for windows), fingerprint (any string; a stored state with another
--          fingerprint is ignored: a changed policy starts fresh)
--
-- All-or-nothing: every policy is evaluated first; only if all admit (and cost > 0) is any
-- state written. When the request is denied, the policies that would have admitted report
-- their fields as if nothing were consumed.
--
-- Returns {now, then per policy 11 integers: allowed, remaining, retry whole ms (-1: never),
-- retry num, retry den, reset whole, num, den, delay whole, num, den}: each duration is
-- whole + num / den ms, exactly.

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local cost = tonumber(ARGV[2])
local min_ttl = tonumber(ARGV[3])
local count = tonumber(ARGV[4])
if not now or not cost or not min_ttl or not count then
  return redis.error_reply('TURNSTILE_ARGS malformed arguments')
end

local policies, states, results = {}, {}, {}
local k = 1
for i = 1, count do
  local base = 4 + (i - 1) * 5
  local p = {
    alg = tonumber(ARGV[base + 1]), L = tonumber(ARGV[base + 2]), P = tonumber(ARGV[base + 3]),
    B = tonumber(ARGV[base + 4]), fp = ARGV[base + 5], key = KEYS[k],
  }
  k = k + 1
  if p.alg == 5 then
    p.logkey = KEYS[k]
    k = k + 1
  end
  local impl = ALG[p.alg]
  if not impl or not p.L or not p.P or not p.B or not p.key then
    return redis.error_reply('TURNSTILE_ARGS malformed policy ' .. i)
  end
  local st = impl.read(p, now)
  if st.err then return st end
  -- A clock earlier than the key's last update: use the last update's time.
  p.now = now
  if st.updated > now then p.now = st.updated end
  local r = impl.decide(p, st, p.now, cost)
  if r.err then return redis.error_reply(r.err) end
  policies[i], states[i], results[i] = p, st, r
end

local all = true
for i = 1, count do
  if results[i].allowed == 0 then all = false end
end

if cost > 0 then
  for i = 1, count do
    local p = policies[i]
    if all then
      local ttl = dur_ceil(results[i].reset)
      if ttl < min_ttl then ttl = min_ttl end
      if ttl < 1 then ttl = 1 end
      ALG[p.alg].write(p, states[i], p.now, results[i], ttl, cost)
    elseif results[i].allowed == 1 then
      -- Denied overall: report this policy as if nothing were consumed.
      local r = ALG[p.alg].decide(p, states[i], p.now, 0)
      if r.err then return redis.error_reply(r.err) end
      r.delay = ZERO
      results[i] = r
    end
  end
end

local out = {now}
for i = 1, count do
  local r = results[i]
  out[#out + 1] = r.allowed
  out[#out + 1] = r.remaining
  if r.retry then
    out[#out + 1] = r.retry[1]
    out[#out + 1] = r.retry[2]
    out[#out + 1] = r.retry[3]
  else
    out[#out + 1] = -1
    out[#out + 1] = 0
    out[#out + 1] = 1
  end
  for _, d in ipairs({r.reset, r.delay}) do
    out[#out + 1] = d[1]
    out[#out + 1] = d[2]
    out[#out + 1] = d[3]
  end
end
return out
