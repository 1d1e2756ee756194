from recipegen.cli import main

main()
