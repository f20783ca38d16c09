package migrations_test

import (
	"fmt"
	"io/fs"
	"log"

	"github.com/idemkit/idem/migrations"
)

// The files are plain SQL for tools of your own, such as golang-migrate or
// psql; postgres.Migrate applies them itself.
func Example() {
	ups, err := fs.Glob(migrations.FS, "*.up.sql")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ups[0])
	// Output: 0001_idempotency_keys.up.sql
}
