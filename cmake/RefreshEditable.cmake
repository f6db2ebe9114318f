# cmake -DDESTINATION=DIR -DFILES="a|b|c" -P RefreshEditable.cmake: copies
# FILES into DESTINATION when that directory exists (the editable install's
# package directory: absent while `pip install -e .` itself builds, or where
# pip installed elsewhere, with --user or --target).
if(IS_DIRECTORY "${DESTINATION}")
  string(REPLACE "|" ";" files "${FILES}")
  file(COPY ${files} DESTINATION "${DESTINATION}")
endif()
