package workspace_test

import "time"

func epochPlus() time.Time { return time.Unix(1700000000, 0) }
