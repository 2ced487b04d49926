-- turnstile: token bucket (id 1) and leaky bucket (id 3), and GCRA (id 2, gcra.lua), which
-- keeps the same state: the buckets' arithmetic, written once. Composed at the top level
-- (after prelude.lua, before fast.lua), so every path reaches it: the fast path (fast.lua
-- calls bucket_decide on the numbers it matched), and the general path (methods.lua's
-- methods, states.lua's carry-over, refunds and queries all start from it).
--
-- State at KEY: "alg.L.P.B|updated_ms|debt", debt D = (B - x) * P for x tokens held
-- (token bucket) or D = y * P for y units queued (leaky bucket): an integer in units of
-- 1/L ms, relative to updated_ms, at most B * P. A refill over d ms subtracts d * L, down to
-- 0. Admit iff D <= (B - c) * P, then D += c * P.

-- The decision of bucket policy p (token bucket, GCRA or leaky bucket: p.alg, p.L, p.P,
-- p.B) at now for cost c on the state (updated, debt) (updated <= now; debt a number, or its
-- digits as stored; the fourth argument, a window state's second count, is unused), written
-- at out[o + 1 ..]: retry (-1: never), remaining, reset, and for the leaky bucket delay,
-- each duration as its numerator over L (D / L ms and the like: exact, at most B * P).
-- Returns whether it admits, reset_after in whole ms rounded up, and the debt after: the
-- one to store when it admits c > 0, else the debt at now (a query's: what a refund and a
-- carry-over start from). Returns nil when the state is none a request leaves (a debt above
-- B * P): every path reports it as invalid state, or leaves it to the general path.
local function bucket_decide(p, updated, debt, _, now, c, out, o)
  local L, P, B = p.L, p.P, p.B
  debt = debt + 0
  if debt > B * P then return nil end
  -- Refilled: 0 once (now - updated) * L >= debt (a product past 2^53 rounds to a double
  -- at least debt, rounding being monotonic: the comparison is exact), else the difference,
  -- below 2^53 and exact.
  local D, refill = 0, (now - updated) * L
  if refill < debt then D = debt - refill end
  local retry, after, delay = -1, D, 0
  if c == 0 then
    retry, delay = 0, D
  elseif c <= B then
    local room = (B - c) * P
    if D <= room then
      after, retry, delay = D + c * P, 0, D
    else
      retry = D - room
    end
  end
  local r = after % P
  local used = (after - r) / P
  if r > 0 then used = used + 1 end
  out[o + 1], out[o + 2], out[o + 3] = retry, B - used, after
  if p.alg == 3 then out[o + 4] = delay end
  r = after % L
  if r > 0 then return retry == 0, (after - r) / L + 1, after end
  return retry == 0, after / L, after
end
