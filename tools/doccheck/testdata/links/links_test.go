package links

// helper is declared in a test file: [helper] is text and [Helper] names
// nothing, but [Helper2] does.
func helper() {}

// Helper2 is declared in a test file.
func Helper2() {}
