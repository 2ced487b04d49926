-- turnstile: fixed window (id 4), its arithmetic written once. Window index w = floor(now /
-- P) from the epoch. Composed at the top level (after prelude.lua, before fast.lua), so every
-- path reaches it: the fast path (fast.lua calls fixed_decide on the numbers it matched) and
-- the general path (methods.lua's methods and states.lua's carry-over start from it).
--
-- State at KEY: "alg.L.P.B|updated_ms|n", n the units admitted in updated_ms's window
-- w = floor(updated_ms / P), never more than L.

-- The decision of fixed window p (p.L, p.P) at now for cost c on the state (updated, n)
-- (updated <= now; n a number, or its digits as stored; the fourth argument is unused),
-- written at out[o + 1 ..]: retry (-1: never), remaining and reset, in whole ms. Returns
-- whether it admits, reset_after in ms, and the count after: the one to store when it
-- admits c > 0, else the count in now's window (a query's: what a carry-over starts from).
-- Returns nil when the state is none a request leaves (n above L).
local function fixed_decide(p, updated, n, _, now, c, out, o)
  local L, P = p.L, p.P
  n = n + 0
  if n > L then return nil end
  local e = now % P
  -- n counts in now's window only when updated's is the same
  if updated - updated % P ~= now - e then n = 0 end
  local retry, k = -1, n
  if c == 0 then
    retry = 0
  elseif c <= L then
    if n <= L - c then
      retry, k = 0, n + c
    else
      retry = P - e
    end
  end
  -- reset_after: to the window's end once anything is counted in it
  local reset = 0
  if k > 0 then reset = P - e end
  out[o + 1], out[o + 2], out[o + 3] = retry, L - k, reset
  return retry == 0, reset, k
end
