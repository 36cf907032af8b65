package profile

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// on_budget's default is applied once, at load: BudgetAction says "fail"
// for a profile that leaves the key out, while the key itself stays as
// written (so neither the digest nor `profiles check` changes).
func TestBudgetActionResolved(t *testing.T) {
	t.Parallel()
	const metered = "image = 'i'\ncommand = ['a']\negress = ['api.example.com:443']\n" +
		"egress_inject = [{ host = 'api.example.com:443', header = 'x-api-key', from_env = 'KEY' }]\nmax_model_requests = 5\n"
	ps, err := ParseProfiles("b.toml", []byte("[profiles.fail]\n"+metered+"[profiles.pause]\n"+metered+"on_budget = 'pause'\n"))
	require.NoError(t, err)
	require.Equal(t, OnBudgetFail, ps["fail"].BudgetAction())
	require.Empty(t, ps["fail"].OnBudget, "the key stays as written")
	require.Equal(t, OnBudgetPause, ps["pause"].BudgetAction())
	require.Equal(t, OnBudgetFail, ShellProfile().BudgetAction(), "a profile without budgets too")
}
