-- turnstile: the sliding log's list (sliding_log.lua gives the algorithm and its state), read
-- and written by check's general path, and the sliding log's methods there (see METHODS in
-- methods.lua). Composed inside general_path(), after reading.lua and methods.lua.

local CHUNK = 128

-- One entry of st's log: its time and cost, or nil when there is none (s is nil), or nil
-- and an error when s is not an entry st's log can hold (cost 0, a time after st's last
-- update, anything but "digits:digits").
local function log_entry(p, st, s)
  if not s then return nil end
  local t, c = match(s, '^(%d+):(%d+)$')
  if t then t, c = t + 0, c + 0 end
  if not t or t > MAX_EXACT or c > MAX_EXACT or c < 1 or t > st.updated then
    return nil, nil, bad(p.logkey)
  end
  return t, c
end

-- The log's entries from index i on, CHUNK at a time, or nil and an error.
local function log_range(p, i)
  return read(p.logkey, 'LRANGE', p.logkey, i, i + CHUNK - 1)
end

-- The newest entry of the log, or nil, or nil and an error.
local function log_newest(p, st)
  local s, err = read(p.logkey, 'LINDEX', p.logkey, -1)
  if err then return nil, nil, err end
  return log_entry(p, st, s)
end

-- The expired prefix of st's log at now (the entries with now - time >= P): their count,
-- their cost, and the index of the first live entry (nil: none is); or nil and an error.
local function log_expired(p, st, now)
  local P = p.P
  -- The oldest entry first: when it is live (the common case) nothing has expired, and no
  -- range is read; the walk below would have stopped at it too.
  local first, err = read(p.logkey, 'LINDEX', p.logkey, 0)
  if err then return nil, nil, nil, err end
  if first then
    local t, _, e = log_entry(p, st, first)
    if e then return nil, nil, nil, e end
    if now - t < P then return 0, 0, 0 end
  end
  local n, cost, i = 0, 0, 0
  while true do
    local chunk, e = log_range(p, i)
    if e then return nil, nil, nil, e end
    -- The log's entries add up to total: no log, no total.
    if i == 0 and #chunk == 0 and st.total > 0 then
      return nil, nil, nil, bad(p.logkey, 'no log')
    end
    if #chunk == 0 then return n, cost, nil end
    for j = 1, #chunk do
      local t, c, e2 = log_entry(p, st, chunk[j])
      if e2 then return nil, nil, nil, e2 end
      if now - t < P then return n, cost, i + j - 1 end
      n, cost = n + 1, cost + c
    end
    i = i + CHUNK
  end
end

-- The retry of a request denied with need units too many: the live entries (from index i)
-- walked oldest first until the cost they free covers need; the wait until that entry
-- expires. Or nil and an error (the live entries add up to used >= need: a walk that ends
-- short is a total above the log's, a state no requests leave).
local function log_retry(p, st, now, i, need)
  local freed = 0
  while i do
    local chunk, err = log_range(p, i)
    if err then return nil, err end
    if #chunk == 0 then break end
    for j = 1, #chunk do
      local t, cost, e = log_entry(p, st, chunk[j])
      if e then return nil, e end
      freed = freed + cost
      if freed >= need then return p.P - (now - t) end
    end
    i = i + CHUNK
  end
  return nil, bad(p.key, 'total above the log')
end

local function log_fresh() return {updated = 0, total = 0, fresh = true} end

local function log_parse(q, updated, total) return {updated = updated, total = total} end

-- Writes retry (-1: never), remaining and reset, in whole ms; nil and an error when the log
-- cannot be read. Admission is sliding_log.lua's log_admits, on the live entries' cost.
local function log_decide(p, st, now, c, out, o)
  local L, P = p.L, p.P
  local expired_n, expired_cost, live_from, err = 0, 0, nil, nil
  if not st.fresh then
    expired_n, expired_cost, live_from, err = log_expired(p, st, now)
    if err then return nil, err end
  end
  if expired_cost > st.total then return nil, bad(p.key, 'total below the log') end
  local used = st.total - expired_cost
  local newest, newest_cost = nil, nil
  if live_from then
    newest, newest_cost, err = log_newest(p, st)
    if err then return nil, err end
  end
  -- The newest entry, for admitted (which follows this decide, the log unchanged but for
  -- its expired prefix: the newest stays, or there is none).
  p.newest, p.newest_cost = newest, newest_cost
  if log_admits(p, used, c, out, o) then
    p.prune, p.total = expired_n, used + c
    return true, P
  end
  -- an entry logged at t expires P - (now - t) ms from now
  local reset = 0
  if newest then reset = P - (now - newest) end
  local rem = L - used
  if rem < 0 then rem = 0 end
  local retry = -1
  if c == 0 then
    retry = 0
  elseif c <= L then
    retry, err = log_retry(p, st, now, live_from, used + c - L)
    if not retry then return nil, err end
  end
  out[o + 1], out[o + 2], out[o + 3] = retry, rem, reset
  return retry == 0, reset
end

-- Writes the log itself; returns the state to store at KEY. decide has just read the log
-- (its newest live entry included: p.newest) without error.
local function log_admitted(p, st, now, c)
  if st.fresh then
    -- no state (or another algorithm's): drop whatever log is left
    redis.call('DEL', p.logkey)
  elseif p.prune > 0 then
    redis.call('LTRIM', p.logkey, p.prune, -1)
  end
  local t, cost = p.newest, p.newest_cost
  if t == now then
    redis.call('LSET', p.logkey, -1, int(now) .. ':' .. int(cost + c))
  else
    redis.call('RPUSH', p.logkey, int(now) .. ':' .. int(c))
  end
  return {updated = now, total = p.total}
end

-- Shrinks the newest live entries first; writes the log itself. decide has read the log
-- without error.
local function log_refund(p, st, now, c)
  if st.fresh then return nil end
  local rest, total = c, st.total
  while rest > 0 do
    local t, cost = log_newest(p, st)
    if not t or now - t >= p.P then break end
    local take = min(rest, cost)
    if take == cost then
      redis.call('RPOP', p.logkey)
    else
      redis.call('LSET', p.logkey, -1, int(t) .. ':' .. int(cost - take))
    end
    total, rest = total - take, rest - take
  end
  return {updated = now, total = total}
end

local function log_encode(params, st) return format('%s|%d|%d', params, st.updated, st.total) end

METHODS[5] = {
  fresh = log_fresh, parse = log_parse, decide = log_decide, admitted = log_admitted,
  refund = log_refund, encode = log_encode,
}
