-- turnstile: the algorithms' methods on the general path's states (see ALG and METHODS in
-- prelude.lua): the buckets', the fixed window's and the sliding window's here, the sliding
-- log's in log_list.lua. Composed inside general_path(), after reading.lua: an EVALSHA call
-- the fast path decides creates none of them.
--
-- A state is a table: {updated, and the algorithm's numbers by name}. fresh is a fresh
-- key's; parse(q, numbers...) the state stored under q's parameters; decide(p, st, now, c,
-- out, o) calls the algorithm's arithmetic (bucket.lua, fixed_window.lua,
-- sliding_window.lua) on st's numbers and keeps the numbers it returns for admitted, or
-- returns nil and the error when they are none a request leaves (the arithmetic's nil:
-- every state read is decided before anything is written); admitted(p, st, now, c) the state after an admission of c > 0 that decide just
-- allowed (in place: st, in p's terms and read by this call only, is not used again);
-- refund(p, st, now, c) the state with c units given back, or nil when there is nothing to
-- give back; encode(params, st) the stored text.

-- Buckets (token bucket, GCRA, leaky bucket): updated, debt (<= B * P).
local function bucket_fresh() return {updated = 0, debt = 0} end

local function bucket_parse(q, updated, debt) return {updated = updated, debt = debt} end

-- The error of p's state that is none a request leaves.
local function unleft(p) return bad(p.key, 'the state of ' .. p.name) end

local function bucket_method(p, st, now, c, out, o)
  local ok, reset, after = bucket_decide(p, st.updated, st.debt, 0, now, c, out, o)
  if ok == nil then return nil, unleft(p) end
  p.after = after
  return ok, reset
end

local function bucket_admitted(p, st, now)
  st.updated, st.debt = now, p.after
  return st
end

local function bucket_refund(p, st, now, c)
  local _, _, D = bucket_decide(p, st.updated, st.debt, 0, now, 0, SCRATCH, 0)
  D = D - min(c, p.B) * p.P
  if D < 0 then D = 0 end
  return {updated = now, debt = D}
end

local function bucket_encode(params, st) return format('%s|%d|%d', params, st.updated, st.debt) end

local BUCKET = {
  fresh = bucket_fresh, parse = bucket_parse, decide = bucket_method,
  admitted = bucket_admitted, refund = bucket_refund, encode = bucket_encode,
}
METHODS[1], METHODS[2], METHODS[3] = BUCKET, BUCKET, BUCKET

-- Fixed window: updated, n (<= L); w, updated's window (-1 fresh: no window).
local function fixed_fresh() return {updated = 0, w = -1, n = 0} end

local function fixed_parse(q, updated, n)
  return {updated = updated, w = divmod(updated, q.P), n = n}
end

local function fixed_method(p, st, now, c, out, o)
  local ok, reset, k = fixed_decide(p, st.updated, st.n, 0, now, c, out, o)
  if ok == nil then return nil, unleft(p) end
  p.n = k
  return ok, reset
end

local function fixed_admitted(p, st, now)
  st.updated, st.n = now, p.n
  return st
end

-- Refunded in the window it was counted in only.
local function fixed_refund(p, st, now, c)
  local w = divmod(now, p.P)
  if st.w ~= w then return nil end
  local n = st.n - c
  if n < 0 then n = 0 end
  return {updated = now, w = w, n = n}
end

local function fixed_encode(params, st) return format('%s|%d|%d', params, st.updated, st.n) end

METHODS[4] = {
  fresh = fixed_fresh, parse = fixed_parse, decide = fixed_method,
  admitted = fixed_admitted, refund = fixed_refund, encode = fixed_encode,
}

-- Sliding window: updated, cur and prev (<= L); w, updated's window (-2 fresh).
local function sliding_fresh() return {updated = 0, w = -2, cur = 0, prev = 0} end

local function sliding_parse(q, updated, cur, prev)
  return {updated = updated, w = divmod(updated, q.P), cur = cur, prev = prev}
end

local function sliding_method(p, st, now, c, out, o)
  local ok, reset, n, m = sliding_decide(p, st.updated, st.cur, st.prev, now, c, out, o)
  if ok == nil then return nil, unleft(p) end
  p.n, p.m = n, m
  return ok, reset
end

local function sliding_admitted(p, st, now)
  st.updated, st.cur, st.prev = now, p.n, p.m
  return st
end

-- Refunded from the current window's count first, then the previous one's, while either
-- is now's or the one before.
local function sliding_refund(p, st, now, c)
  local w = divmod(now, p.P)
  if st.w ~= w and st.w + 1 ~= w then return nil end
  local _, _, n, m = sliding_decide(p, st.updated, st.cur, st.prev, now, 0, SCRATCH, 0)
  local take = min(c, n)
  m = m - (c - take)
  if m < 0 then m = 0 end
  return {updated = now, w = w, cur = n - take, prev = m}
end

local function sliding_encode(params, st)
  return format('%s|%d|%d|%d', params, st.updated, st.cur, st.prev)
end

METHODS[6] = {
  fresh = sliding_fresh, parse = sliding_parse, decide = sliding_method,
  admitted = sliding_admitted, refund = sliding_refund, encode = sliding_encode,
}
