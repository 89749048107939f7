// unit tests come next
