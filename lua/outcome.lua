-- turnstile: a check's outcome from its policies' decisions, the same on every path (fast.lua
-- and general.lua call it): the all-or-nothing rule. Composed at the top level, after the
-- algorithms' arithmetic and before fast.lua.

-- The all-or-nothing rule, for a check of cost above 0 denied overall (some policy denied
-- it, so nothing is written): every policy that would have admitted (p.ok) reports its
-- fields as if nothing were consumed — a query's (cost 0), written at out[p.o + 1 ..] — with
-- the leaky bucket's delay 0 (no request joins its queue). The query is made as the policy
-- was decided: on the fast path (fast) on the numbers fast_check kept (p.u, p.na, p.nb at
-- p.t), else by its method on its state (p.st at p.now). Returns the query's error (a table
-- with err), or nil.
local function as_if_nothing_consumed(policies, count, out, fast)
  for i = 1, count do
    local p = policies[i]
    if p.ok then
      if fast then
        p.fast(p, p.u, p.na, p.nb, p.t, 0, out, p.o)
      else
        local ok, err = p.a.decide(p, p.st, p.now, 0, out, p.o)
        if ok == nil then return err end
      end
      if p.alg == 3 then out[p.o + 4] = 0 end
    end
  end
  return nil
end
