-- turnstile: the algorithms' methods on the general path's states (see ALG and METHODS in
-- prelude.lua): the buckets', the fixed window's and the sliding window's here, the sliding
-- log's in log_list.lua. Composed inside general_path(), after reading.lua: an EVALSHA call
-- the fast path decides creates none of them.
--
-- A state is a table: {updated, the algorithm's numbers by name, and for the windows w,
-- updated's window}. fresh() is a fresh key's; parse(q, numbers...) the state stored under
-- q's parameters; decide(p, st, now, c, out, o) calls the algorithm's arithmetic
-- (bucket.lua, fixed_window.lua, sliding_window.lua) on st's numbers and keeps the numbers
-- it returns on p (p.v1, p.v2: after an admission, or at now for a query, which carry-over
-- reads), or returns nil and the error when they are none a request leaves (the
-- arithmetic's nil: every state read is decided before anything is written);
-- admitted(p, st, now, c) the state after an admission of c > 0 that decide just allowed
-- (in place: st, in p's terms and read by this call only, is not used again); refund(p, st,
-- now, c) the state with c units given back, or nil when there is nothing to give back,
-- once decide has queried st at now (general.lua's refund_all: p.v1, p.v2 are st's numbers
-- at now); encode(params, st) the stored text.

-- The methods of an algorithm decided by arith, whose state holds after updated the
-- numbers named f1 and f2 (f2 nil: f1 only), fresh and refunded by fresh and refund.
local function methods_of(arith, f1, f2, fresh, refund)
  local function parse(q, updated, a, b)
    local st = {updated = updated, w = divmod(updated, q.P)}
    st[f1] = a
    if f2 then st[f2] = b end
    return st
  end
  local function decide(p, st, now, c, out, o)
    local ok, reset, v1, v2 = arith(p, st.updated, st[f1], f2 and st[f2], now, c, out, o)
    if ok == nil then return nil, bad(p.key, 'the state of ' .. p.name) end
    p.v1, p.v2 = v1, v2
    return ok, reset
  end
  local function admitted(p, st, now)
    st.updated, st[f1] = now, p.v1
    if f2 then st[f2] = p.v2 end
    return st
  end
  local function encode(params, st)
    if f2 then return format('%s|%d|%d|%d', params, st.updated, st[f1], st[f2]) end
    return format('%s|%d|%d', params, st.updated, st[f1])
  end
  return {
    fresh = fresh, parse = parse, decide = decide, admitted = admitted, refund = refund,
    encode = encode,
  }
end

-- Buckets (token bucket, GCRA, leaky bucket): updated, debt (<= B * P). Refunded from the
-- debt at now (p.v1).
local function bucket_fresh() return {updated = 0, debt = 0} end

local function bucket_refund(p, st, now, c)
  local D = p.v1 - min(c, p.B) * p.P
  if D < 0 then D = 0 end
  return {updated = now, debt = D}
end

-- Fixed window: updated, n (<= L); w -1 fresh (no window). Refunded in the window it was
-- counted in only.
local function fixed_fresh() return {updated = 0, w = -1, n = 0} end

local function fixed_refund(p, st, now, c)
  local w = divmod(now, p.P)
  if st.w ~= w then return nil end
  local n = st.n - c
  if n < 0 then n = 0 end
  return {updated = now, w = w, n = n}
end

-- Sliding window: updated, cur and prev (<= L); w -2 fresh. Refunded from the current
-- window's count first, then the previous one's (both seen from now's window: p.v1, p.v2),
-- while either is now's or the one before.
local function sliding_fresh() return {updated = 0, w = -2, cur = 0, prev = 0} end

local function sliding_refund(p, st, now, c)
  local w = divmod(now, p.P)
  if st.w ~= w and st.w + 1 ~= w then return nil end
  local n, m = p.v1, p.v2
  local take = min(c, n)
  m = m - (c - take)
  if m < 0 then m = 0 end
  return {updated = now, w = w, cur = n - take, prev = m}
end

-- The arithmetic reached through fast.lua's FAST (bucket_decide, fixed_decide,
-- sliding_decide): one upvalue of general_path rather than three, which an EVALSHA call
-- pays for at every call (see check.lua).
local BUCKET = methods_of(FAST[1], 'debt', nil, bucket_fresh, bucket_refund)
METHODS[1], METHODS[2], METHODS[3] = BUCKET, BUCKET, BUCKET
METHODS[4] = methods_of(FAST[4], 'n', nil, fixed_fresh, fixed_refund)
METHODS[6] = methods_of(FAST[6], 'cur', 'prev', sliding_fresh, sliding_refund)
